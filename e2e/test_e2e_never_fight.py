"""Never fight, in own mode: conditions other writers add survive our status writes; and beside
LLMKube's reconciler (which owns replicas in its own right) the service sees the conflict when
the reconciler undoes it, stops actuating the pool, says so, and no member's replicas flap.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from devstack.stack import LocalStack
from e2e_support import (NAMESPACE, chat, condition, eventually, notices, pools, start_stack,
                          status, wait_resident)

STACK_DOCS = pools(("guest", ["guest-a", "guest-b"], {"default": "guest-a"}))
FOREIGN = {"type": "example.com/Audited", "status": "True", "reason": "Checked",
           "message": "added by another tool", "lastTransitionTime": "2026-01-01T00:00:00Z"}


async def test_a_condition_of_another_writer_survives_our_writes(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "guest", "guest-a", timeout=30)
    conditions = status(stack, "guest")["conditions"] + [FOREIGN]
    stack.kubectl("patch", "mpool", "guest", "-n", NAMESPACE, "--subresource=status",
                  "--type=merge", "-p", json.dumps({"status": {"conditions": conditions}}))
    reply = await chat(http, stack, "guest-b")  # a swap: several status writes of ours
    assert (reply.status, reply.served_by) == (200, "guest-b")
    await wait_resident(stack, "guest", "guest-b")
    assert condition(stack, "guest", FOREIGN["type"]) == FOREIGN
    assert not notices(stack, "guest", "ActuationChanged")  # one added condition is no fight


def member_writes(stack: LocalStack, member: str, user: str | None = None) -> int:
    """Patches of ``member``'s InferenceService so far, by anyone or by ``user`` (the
    emulator's record)."""
    return len([c for c in stack.api_requests(user) if c["resource"] == "inferenceservices"
                and c.get("name") == member and c["verb"] == "patch"
                and c.get("subresource") is None])


async def quiet(stack: LocalStack, members: tuple[str, ...], *, still: float = 3.0,
                within: float = 20.0) -> dict[str, int]:
    """Every member's patch count once none has changed for ``still`` seconds (bounded)."""
    counts = {m: member_writes(stack, m) for m in members}
    since, deadline = time.monotonic(), time.monotonic() + within
    while time.monotonic() - since < still and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = {m: member_writes(stack, m) for m in members}
        if now != counts:
            counts, since = now, time.monotonic()
    return counts


async def test_beside_llmkube_own_mode_stops_actuating_once_undone_and_nothing_flaps(
        tmp_path_factory, http: aiohttp.ClientSession) -> None:
    """Own mode notices another actuator by what it undoes (guarantees.md): the reconciler
    stand-in undoes our first swap when it sees the incumbent scaled down before our
    ``pendingMember`` (most runs: the pool goes hands-off), or follows that ``pendingMember``
    from the start (seen once in twelve fresh-clone runs: the two agree, the swap completes,
    and there is nothing to notice). Either way
    the request is answered by its member or with an explicit 503, and nothing flaps."""
    fight = start_stack(tmp_path_factory.mktemp("fight"),
                        pools(("fight", ["fight-a", "fight-b"], {"default": "fight-a"})),
                        actuation="own", reconciler=True)
    members = ("fight-a", "fight-b")
    try:
        await wait_resident(fight, "fight", "fight-a", timeout=30)
        held = asyncio.create_task(chat(http, fight, "fight-b"))
        await eventually(lambda: notices(fight, "fight", "ActuationChanged") or held.done(),
                         40, "the service to hand the pool over or serve the request")
        reply = await held
        handed = notices(fight, "fight", "ActuationChanged")
        ours = {m: member_writes(fight, m, "modelpool-extproc") for m in members}
        if handed:
            assert [c["target"] for c in handed] == ["hands-off"], handed
            assert fight.metric("modelpool_extproc_conflicts_total", pool="fight") >= 1
            assert reply.status in (200, 503), reply.body  # LLMKube's call, or a clear 503
        else:  # the reconciler followed our pendingMember: one swap, done together
            assert (reply.status, reply.served_by) == (200, "fight-b"), reply.body
            await wait_resident(fight, "fight", "fight-b")
        # LLMKube may still finish the swap it started (a write per member); then nothing
        # moves any more, and (handed off) none of it was ours
        settled = await quiet(fight, members)
        if handed:
            assert {m: member_writes(fight, m, "modelpool-extproc") for m in members} == ours
        until = time.monotonic() + 6.0  # two reconciler requeues: nothing moves any more
        while time.monotonic() < until:
            await asyncio.sleep(0.5)
        assert {m: member_writes(fight, m) for m in settled} == settled
        assert status(fight, "fight")["phase"] in ("Ready", "Swapping")
    finally:
        fight.stop()
