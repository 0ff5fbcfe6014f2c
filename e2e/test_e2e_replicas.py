"""Three ext_proc replicas behind one Envoy (docs/design/replicas.md): swaps driven through any
replica, the pool's leader SIGKILLed mid-swap, a follower cut off from the API server, a follower paused.

The invariant checker replays the API history (never two members with pods; no scale-up while
another member is up), and every client sees its own member or 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from devstack.stack import LocalStack
from e2e_support import NAMESPACE, chat, eventually, pools, wait_resident
from faults.invariants import ApiRecorder, exclusive_slot

LOAD = "sim.llmkube.dev/load-delay"
UNLOAD = "sim.llmkube.dev/unload-delay"
STACK_DOCS = pools(
    ("ha", ["ha-a", "ha-b"], {"default": "ha-a"}),
    # slow stages, so that a kill lands inside each one
    ("stages", ["st-a", "st-b"], {"default": "st-a", "member_annotations": {
        "st-a": {LOAD: "3s", UNLOAD: "3s"}, "st-b": {LOAD: "3s", UNLOAD: "3s"}}}),
)
# a killed replica's requests are settled by the member's idle probe (the stack's probe router
# asks the member's llama.cpp-style /slots), or else after this wait: a cap, never 600 s here
STACK_OPTIONS = {"replicas": 3, "api_proxies": True,
                 "extproc_args": ["--lost-replica-wait", "20s"]}
POOLS = {(NAMESPACE, "ha"): ["ha-a", "ha-b"], (NAMESPACE, "stages"): ["st-a", "st-b"]}


def leases(stack: LocalStack) -> dict[str, dict]:
    """The Leases in the stack's Lease namespace, by name."""
    listing = stack.get(f"/apis/coordination.k8s.io/v1/namespaces/{stack.lease_namespace}/leases")
    return {item["metadata"]["name"]: item for item in listing["items"]}


def leader(stack: LocalStack, pool: str = "ha") -> str:
    """The replica leading ``pool``: the holder of the replica set's one leader Lease ("" if
    none)."""
    lease = leases(stack).get("modelpool-extproc-leader") or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def replica_named(stack: LocalStack, name: str):
    """The stack's handle of replica ``name``."""
    return next(r for r in stack.replicas if r.name == name)


def other(member: str) -> str:
    prefix, _, last = member.rpartition("-")
    return f"{prefix}-{'b' if last == 'a' else 'a'}"


def resident(stack: LocalStack, pool: str = "ha") -> str:
    return (stack.pool(pool, NAMESPACE).get("status") or {}).get("residentMember") or ""


def replicas_of(stack: LocalStack, member: str) -> int:
    return int((stack.isvc(member).get("spec") or {}).get("replicas") or 0)


def serving(replica) -> bool:
    """What the replica's gRPC health says, as its serving gauge shows it."""
    return replica.metric("modelpool_extproc_serving") == 1


def served_or_retry(reply, model: str) -> bool:
    """Its own member answered, or an explicit 503 with Retry-After."""
    if reply.status == 200:
        return reply.served_by == model
    return reply.status == 503 and "retry-after" in reply.headers


async def test_every_replica_holds_a_membership_lease_and_one_leads(stack: LocalStack) -> None:
    await eventually(lambda: leader(stack), what="a leader for pool ha")
    names = set(leases(stack))
    assert {f"modelpool-extproc-{r.name}" for r in stack.replicas} <= names

    def published() -> dict:
        lease = leases(stack)[f"modelpool-extproc-{stack.replicas[0].name}"]
        return json.loads(lease["metadata"]["annotations"]
                          ["modelpool.inference.llmkube.dev/replica-state"])
    # written before any pool was read (so no peer misses it); an idle pool is left out of
    # it (a reader takes a pool it does not name as nothing held, nothing in flight), so the
    # Lease does not grow with the pools at rest
    payload = await eventually(lambda: published() if published().get("incarnation") else None,
                               what="the replica's membership payload")
    assert isinstance(payload["pools"], dict) and f"{NAMESPACE}/ha" not in payload["pools"]


async def test_swaps_through_every_replica_keep_the_slot_exclusive(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    recorder = await ApiRecorder(stack.kubeapi_url).start()
    try:
        replies = []
        for round_ in range(3):  # Envoy spreads the streams over the three replicas
            model = other(resident(stack) or "ha-a") if round_ else "ha-b"
            replies += await asyncio.gather(*(chat(http, stack, model) for _ in range(6)))
            await wait_resident(stack, "ha", model)
        assert all(r.status == 200 and r.served_by == r_model
                   for r, r_model in zip(replies, [m for m in ("ha-b", "ha-a", "ha-b")
                                                  for _ in range(6)])), \
            [(r.status, r.served_by) for r in replies]
    finally:
        events = await recorder.stop()
    assert exclusive_slot(events, POOLS) == []


@pytest.mark.parametrize("stage", ["draining", "unloading", "loading"])
async def test_leader_killed_in_each_swap_stage_the_next_leader_completes_it(
        stack: LocalStack, http: aiohttp.ClientSession, stage: str) -> None:
    start = resident(stack, "stages") or "st-a"
    await wait_resident(stack, "stages", start, timeout=40)
    await eventually(lambda: leader(stack, "stages"), what="a leader")
    boss = replica_named(stack, leader(stack, "stages"))
    target = other(start)
    recorder = await ApiRecorder(stack.kubeapi_url).start()
    try:
        # draining: a long stream on the incumbent keeps the drain open while the leader dies
        streaming = asyncio.create_task(chat(http, stack, start, stream=True, tokens=40,
                                             token_delay_ms=100)) if stage == "draining" \
            else None
        await asyncio.sleep(0.5)
        held = [asyncio.create_task(chat(http, stack, target)) for _ in range(4)]
        moments = {
            "draining": lambda: (stack.pool("stages", NAMESPACE).get("status") or {})
            .get("pendingMember") == target and replicas_of(stack, start) == 1,
            "unloading": lambda: replicas_of(stack, start) == 0 and replicas_of(stack, target) == 0,
            "loading": lambda: replicas_of(stack, target) == 1 and resident(stack, "stages") != target,
        }
        await eventually(moments[stage], what=f"the swap {stage}")
        await asyncio.to_thread(boss.kill)
        await eventually(lambda: leader(stack, "stages") not in ("", boss.name), timeout=40,
                         what="another replica takes the leader Lease")
        await wait_resident(stack, "stages", target, timeout=60)
        replies = await asyncio.gather(*held)
        assert all(served_or_retry(r, target) for r in replies), \
            [(r.status, r.served_by, r.body[:80]) for r in replies]
        if streaming is not None:
            # routed before the leader died: it streams to its end from the incumbent, which
            # the new leader unloads only afterwards (the dead leader's count is unknown)
            reply = await streaming
            assert reply.status == 200 and reply.served_by == start and len(reply.events) > 30
        after = await chat(http, stack, target)
        assert after.status == 200 and after.served_by == target
    finally:
        events = await recorder.stop()
        await asyncio.to_thread(boss.restart, 60)
    assert exclusive_slot(events, POOLS) == []


async def test_a_follower_cut_off_from_the_api_fails_closed_and_comes_back(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await eventually(lambda: leader(stack), what="a leader")
    follower = next(r for r in stack.replicas if r.name != leader(stack))
    assert follower.proxy is not None
    follower.proxy.cut()
    try:
        # past duration - margin (8 s) it reports NOT_SERVING: Envoy stops sending it streams
        await eventually(lambda: serving(follower) is False, timeout=20,
                         what="the cut-off follower to stop serving")
        model = resident(stack) or "ha-a"
        replies = await asyncio.gather(*(chat(http, stack, model) for _ in range(6)))
        assert all(served_or_retry(r, model) for r in replies)
    finally:
        follower.proxy.restore()
    await eventually(lambda: serving(follower) is True, timeout=30,
                     what="the follower to serve again after a renew and a re-list")
    assert "re-listing before admitting again" in follower.log_path.read_text()


async def test_a_follower_paused_during_a_drain_never_routes_to_the_incumbent_after(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await eventually(lambda: leader(stack), what="a leader")
    start = resident(stack) or "ha-a"
    await wait_resident(stack, "ha", start)
    follower = next(r for r in stack.replicas if r.name != leader(stack))
    recorder = await ApiRecorder(stack.kubeapi_url).start()
    try:
        target = other(start)
        held = asyncio.create_task(chat(http, stack, target))
        await eventually(lambda: (stack.pool("ha", NAMESPACE).get("status") or {})
                         .get("pendingMember") == target, what="the swap under way")
        await asyncio.to_thread(follower.pause)
        await asyncio.sleep(14)  # past its lease + margin: the others count it lost
        await asyncio.to_thread(follower.resume)
        await wait_resident(stack, "ha", target, timeout=60)
        reply = await held
        assert served_or_retry(reply, target)
        replies = await asyncio.gather(*(chat(http, stack, target) for _ in range(6)))
        assert all(served_or_retry(r, target) for r in replies), \
            [(r.status, r.served_by) for r in replies]
    finally:
        events = await recorder.stop()
    assert exclusive_slot(events, POOLS) == []
