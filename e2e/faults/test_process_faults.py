"""Members and processes failing: a member stuck in Creating (swap timeout 3 s), the ext_proc
SIGKILLed mid-swap and restarted, Envoy restarted under held requests, and slow clients that
trickle their bodies or stall. Every test ends with the invariant gate."""

from __future__ import annotations

import asyncio

import aiohttp
from faultkit import attempt, trickle, violations_at_rest
from invariants import ApiRecorder

from devstack.stack import LocalStack
from e2e_support import SWAP_BOUND, eventually, notices, pools, wait_resident

SWAP_TIMEOUT = 3.0
LOAD = "sim.llmkube.dev/load-delay"
STACK_OPTIONS = {"extproc_args": ["--swap-timeout", f"{SWAP_TIMEOUT}s"]}
STACK_DOCS = pools(
    ("stuck", ["stuck-a", "stuck-b"],
     {"default": "stuck-a", "swap_budget": "30s",
      "member_annotations": {"stuck-b": {"sim.llmkube.dev/stuck": "true"}}}),
    ("crash", ["crash-a", "crash-b"],
     {"default": "crash-a", "member_annotations": {"crash-b": {LOAD: "2s"}}}),
    ("restart", ["restart-a", "restart-b"],
     {"default": "restart-a", "member_annotations": {"restart-b": {LOAD: "2s"}}}),
    ("trickle", ["trickle-a", "trickle-b"], {"default": "trickle-a"}),
    ("race", ["race-a", "race-b"], {"default": "race-a"}),
)


async def test_member_stuck_in_creating_does_not_wedge_the_pool(
        stack: LocalStack, http: aiohttp.ClientSession, recorder: ApiRecorder) -> None:
    await wait_resident(stack, "stuck", "stuck-a")
    stuck = await attempt(http, stack, "stuck-b")
    # Declared failed at the swap timeout, long before the 30 s budget; an explicit 503.
    assert stuck.status == 503 and stuck.code, stuck
    assert notices(stack, "stuck", "SwapFailed")
    # The slot is not wedged: the other member is loaded again (after stuck-b's pod is gone,
    # which the exclusive-slot check below verifies from the API history).
    back = await attempt(http, stack, "stuck-a", timeout=SWAP_BOUND + SWAP_TIMEOUT)
    assert (back.status, back.served_by) == (200, "stuck-a"), back
    assert await violations_at_rest(stack, recorder, [stuck, back]) == []


async def test_extproc_killed_mid_swap_and_restarted(
        stack: LocalStack, http: aiohttp.ClientSession, recorder: ApiRecorder) -> None:
    await wait_resident(stack, "crash", "crash-a")
    held = asyncio.create_task(attempt(http, stack, "crash-b"))
    await eventually(lambda: [n for n in notices(stack, "crash", "SwapStarted")
                              if n["target"] == "crash-b"], what="the swap to crash-b")
    await asyncio.to_thread(stack.kill_extproc)
    lost = await held
    # Envoy fails open onto the no-routing-header route: an explicit 503, never a member.
    assert (lost.status, lost.code) == (503, "router_unavailable"), lost
    await asyncio.to_thread(stack.start_extproc)
    # The new process picks the half-done swap up from the API and finishes it.
    after = await attempt(http, stack, "crash-b", timeout=SWAP_BOUND * 2)
    assert (after.status, after.served_by) == (200, "crash-b"), after
    back = await attempt(http, stack, "crash-a", timeout=SWAP_BOUND * 2)
    assert (back.status, back.served_by) == (200, "crash-a"), back
    assert await violations_at_rest(stack, recorder, [lost, after, back]) == []


async def test_envoy_restarted_under_held_requests(
        stack: LocalStack, http: aiohttp.ClientSession, recorder: ApiRecorder) -> None:
    await wait_resident(stack, "restart", "restart-a")
    held = [asyncio.create_task(attempt(http, stack, "restart-b")) for _ in range(5)]
    await eventually(lambda: stack.metric("llmkube_modelpool_held_requests",
                                          pool="restart") == 5, what="five held requests")
    assert stack.envoy is not None
    # On the loop's own thread, not to_thread(): Envoy takes SIGTERM when the thread that
    # started it exits (parent-death signal), which would kill the new Envoy after the test.
    stack.envoy.restart()
    cut = await asyncio.gather(*held)
    # Their connections went with the old Envoy; the ext_proc saw the streams end.
    await eventually(lambda: stack.metric("llmkube_modelpool_held_requests",
                                          pool="restart") == 0, what="the held gauge to drop")
    await wait_resident(stack, "restart", "restart-b")  # the swap went on without them
    async with aiohttp.ClientSession() as fresh:  # the old pool's connections are dead
        after = await attempt(fresh, stack, "restart-b")
    assert (after.status, after.served_by) == (200, "restart-b"), after
    assert await violations_at_rest(stack, recorder, [*cut, after], allow_broken=True) == []


async def test_slow_clients_trickling_or_stalling(
        stack: LocalStack, http: aiohttp.ClientSession, recorder: ApiRecorder) -> None:
    await wait_resident(stack, "trickle", "trickle-a")
    slow = [asyncio.create_task(trickle(stack, model, pause=0.2))
            for model in ("trickle-a", "trickle-b") * 10]
    stalled = [asyncio.create_task(trickle(stack, "trickle-b", pause=0.2, stall=True))
               for _ in range(10)]
    # Meanwhile ordinary clients are answered: slow bodies hold nothing but their own stream.
    quick = [await attempt(http, stack, "trickle-a") for _ in range(5)]
    assert [q.status for q in quick] == [200] * 5, quick
    outcomes = await asyncio.gather(*slow, *stalled)
    assert all(o.status == 200 for o in outcomes if not o.gave_up), outcomes
    assert await violations_at_rest(stack, recorder, [*quick, *outcomes]) == []


async def test_swap_right_after_the_resident_pod_dies(
        stack: LocalStack, http: aiohttp.ClientSession, recorder: ApiRecorder) -> None:
    outcomes = []
    for n in range(6):  # a race: a few rounds make it show every time
        resident, other = ("race-a", "race-b") if n % 2 == 0 else ("race-b", "race-a")
        await wait_resident(stack, "race", resident, timeout=30)
        await asyncio.to_thread(stack.annotate, resident, "sim.llmkube.dev/kill-pod", str(n))
        outcomes.append(await attempt(http, stack, other, timeout=SWAP_BOUND * 2))
    assert await violations_at_rest(stack, recorder, outcomes) == []
