"""Own mode's hands-off is a spell with a way out, end to end: entered when another writer
rewrites the pool's status or scales members against us, left by itself after a quiet period
or at once by the resume annotation, routing to every Ready member meanwhile; and a soak of
repeated out-of-band scale-ups ends with the pool Ready and every member served.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from devstack.stack import LocalStack
from e2e_support import (NAMESPACE, SWAP_BOUND, chat, eventually, notices, pools, start_stack,
                          status, wait_resident)

MEMBERS = ["ho-a", "ho-b", "ho-c"]
QUIET = 4.0  # --hands-off-quiet for the automatic exit (the default is 300 s)
RESUME = "modelpool.inference.llmkube.dev/resume"


def pool_stack(tmp_path_factory, pool: str, quiet: float | None = QUIET) -> LocalStack:
    """A started stack with one pool of MEMBERS (default ho-a), hands-off quiet ``quiet``."""
    args = ["--hands-off-quiet", f"{quiet:g}s"] if quiet is not None else []
    return start_stack(tmp_path_factory.mktemp(pool), pools((pool, MEMBERS, {"default": "ho-a"})),
                       extproc_args=args)


def changes(stack: LocalStack, pool: str) -> list[str]:
    """The actuation changes the service announced for ``pool``, in order."""
    return [n["target"] for n in notices(stack, pool, "ActuationChanged")]


async def rewrite_status(stack: LocalStack, pool: str) -> float:
    """Another writer claims the pool's slot fields (what makes own mode step back), again
    each second until the service says it stepped back: a write within the leader's first
    retry period may still be the previous leader's and is not judged (platform.replicas).
    Returns when the first write was sent: no spell can have begun before it."""
    first = time.monotonic()
    until = first + 20
    while changes(stack, pool) != ["hands-off"]:
        assert time.monotonic() < until, "the pool never went hands-off"
        stack.kubectl("patch", "mpool", pool, "-n", NAMESPACE, "--subresource=status",
                      "--type=merge", "-p", json.dumps({"status": {
                          "phase": "Swapping", "pendingMember": "ho-b",
                          "observedGeneration": int(time.monotonic())}}))
        await asyncio.sleep(1.0)
    return first


def scale(stack: LocalStack, member: str, replicas: int) -> None:
    """An operator's ``kubectl scale`` of a member, out of band."""
    stack.kubectl("patch", "isvc", member, "-n", NAMESPACE, "--type=merge",
                  "-p", json.dumps({"spec": {"replicas": replicas}}))


async def test_hands_off_routes_to_ready_members_and_ends_after_a_quiet_period(
        tmp_path_factory, http: aiohttp.ClientSession) -> None:
    stack = pool_stack(tmp_path_factory, "quiet")
    try:
        await wait_resident(stack, "quiet", "ho-a", timeout=30)
        entered = await rewrite_status(stack, "quiet")  # the spell began after this
        [announced] = notices(stack, "quiet", "ActuationChanged")
        assert f"kubectl annotate mpool quiet -n {NAMESPACE} {RESUME}" in announced["msg"]
        described = stack.kubectl("describe", "mpool", "quiet", "-n", NAMESPACE).stdout
        assert "Warning" in described and "hands-off" in described, described
        served = await chat(http, stack, "ho-a")  # Ready: routed while hands-off
        assert (served.status, served.served_by) == (200, "ho-a"), served.body
        refused = await chat(http, stack, "ho-c")  # not Ready: refused, saying how it ends
        assert refused.status == 503 and "pool_conflict" in refused.body, refused.body
        assert "resumes" in refused.body and refused.headers.get("retry-after")
        await eventually(lambda: changes(stack, "quiet") == ["hands-off", "own"], 20 + QUIET,
                         "the spell to end by itself")
        # not before its quiet period: the spell ends QUIET after the last foreign write the
        # service saw, itself after the first we sent (measured from our detection it was
        # short by our polling's lag: 2.9997 s of a 3 s margin once on a loaded machine)
        assert time.monotonic() - entered >= QUIET
        reply = await chat(http, stack, "ho-c")
        assert (reply.status, reply.served_by) == (200, "ho-c"), reply.body
        await wait_resident(stack, "quiet", "ho-c", timeout=SWAP_BOUND + 10)
    finally:
        stack.stop()


async def test_the_resume_annotation_ends_hands_off_at_once(
        tmp_path_factory, http: aiohttp.ClientSession) -> None:
    stack = pool_stack(tmp_path_factory, "resume", quiet=None)  # the default 300 s
    try:
        await wait_resident(stack, "resume", "ho-a", timeout=30)
        await rewrite_status(stack, "resume")
        stack.kubectl("annotate", "mpool", "resume", "-n", NAMESPACE, f"{RESUME}=1",
                      "--overwrite")
        await eventually(lambda: changes(stack, "resume") == ["hands-off", "own"], 20,
                         "the annotation to end the spell")
        [_, resumed] = notices(stack, "resume", "ActuationChanged")
        assert "annotation" in resumed["msg"]
        reply = await chat(http, stack, "ho-b")
        assert (reply.status, reply.served_by) == (200, "ho-b"), reply.body
    finally:
        stack.stop()


async def test_repeated_out_of_band_scale_ups_end_with_the_pool_ready_and_all_served(
        tmp_path_factory, http: aiohttp.ClientSession) -> None:
    """Someone keeps trying ``kubectl scale`` on members while clients use all three."""
    stack = pool_stack(tmp_path_factory, "soak")
    try:
        await wait_resident(stack, "soak", "ho-a", timeout=30)
        answers: list[tuple[str, int, str]] = []

        async def client(model: str) -> None:
            for _ in range(6):  # bounded: 6 requests per member
                reply = await chat(http, stack, model)
                answers.append((model, reply.status, reply.served_by))
                await asyncio.sleep(0.5)

        async def meddler() -> None:
            for i in range(12):  # bounded: 12 out-of-band scale-ups, one every 0.7 s
                scale(stack, MEMBERS[1 + i % 2], 1)
                await asyncio.sleep(0.7)

        await asyncio.gather(meddler(), *(client(m) for m in MEMBERS))
        # every answer is its own member's, or an explicit 503 (the fight, or the budget)
        assert all(code == 200 and by == model or code == 503 for model, code, by in answers), \
            answers
        assert "hands-off" in changes(stack, "soak")  # the fight was seen
        await eventually(lambda: changes(stack, "soak")[-1] == "own", 30 + QUIET,
                         "the pool to be actuated again after the meddling stopped")
        for model in MEMBERS:  # quiet now: every member is served, one after the other
            reply = await chat(http, stack, model)
            assert (reply.status, reply.served_by) == (200, model), reply.body
        await wait_resident(stack, "soak", "ho-c", timeout=SWAP_BOUND + 10)
        up = [m["name"] for m in status(stack, "soak")["members"] if m.get("phase") == "Ready"]
        assert up == ["ho-c"], status(stack, "soak")
    finally:
        stack.stop()
