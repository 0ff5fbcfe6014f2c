"""The API server misbehaving under the ext_proc: unreachable for 10 s mid-swap, watches cut
with 410 Gone, 409 Conflict on first writes; and a pool naming a member that lives in another
namespace. Every test ends with the invariant gate (API history, access log, outcomes)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from faultkit import attempt, emulator, violations_at_rest
from invariants import ApiRecorder

from devstack.stack import LocalStack
from devstack.stack_manifests import member, pool
from e2e_support import (EXTPROC_USER, NAMESPACE, SWAP_BOUND, condition, eventually, notices,
                         pools, status, timeline, wait_resident)

OUTAGE = 10.0  # seconds the API server answers 503 to everyone
ELSEWHERE = "elsewhere"
STACK_DOCS = pools(
    ("outage", ["outage-a", "outage-b"],
     {"default": "outage-a", "swap_budget": "4s",
      "member_annotations": {"outage-b": {"sim.llmkube.dev/load-delay": "2s"}}}),
    ("compacted", ["compacted-a", "compacted-b"],
     {"default": "compacted-a",
      "member_annotations": {"compacted-b": {"sim.llmkube.dev/load-delay": "1.5s"}}}),
    ("conflict", ["conflict-a", "conflict-b"], {"default": "conflict-a"}),
    ("relisted", ["relisted-a", "relisted-b"], {"default": "relisted-a"}),
) + [
    # "stranger" exists only in another namespace; members must share the pool's namespace.
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ELSEWHERE}},
    member("stranger", ELSEWHERE),
    member("foreign-a", NAMESPACE),
    pool("foreign", NAMESPACE, ["foreign-a", "stranger"], default="foreign-a"),
]


async def swap_started(stack: LocalStack, pool_name: str, target: str) -> None:
    """Wait for the ext_proc's SwapStarted notice towards ``target``."""
    await eventually(lambda: [n for n in notices(stack, pool_name, "SwapStarted")
                              if n["target"] == target], what=f"a swap to {target}")


def extproc_call_count(stack: LocalStack) -> int:
    """How many API requests the ext_proc has sent so far."""
    return len(stack.api_requests(EXTPROC_USER))


async def test_api_unreachable_mid_swap(stack: LocalStack, http: aiohttp.ClientSession,
                                        recorder: ApiRecorder) -> None:
    await wait_resident(stack, "outage", "outage-a")
    held = asyncio.create_task(attempt(http, stack, "outage-b"))
    await swap_started(stack, "outage", "outage-b")
    calls = extproc_call_count(stack)
    emulator(stack, "unavailable", {"on": True})
    cut = time.monotonic()
    try:
        outcome = await held
        # Held past its 4 s budget with the API down: an explicit 503 + Retry-After.
        assert (outcome.status, outcome.code) == (503, "swap_budget_exceeded"), outcome
        await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - cut)))
        retries = extproc_call_count(stack) - calls
    finally:
        emulator(stack, "unavailable", {"on": False})
    # It kept trying, with backoff rather than a hot loop (watches and writes, 10 s).
    assert 2 <= retries <= 400, retries
    # The swap was not abandoned: it completes once the API is back.
    await wait_resident(stack, "outage", "outage-b", timeout=40)
    warm = await attempt(http, stack, "outage-b")
    assert (warm.status, warm.served_by) == (200, "outage-b"), warm
    assert await violations_at_rest(stack, recorder, [outcome, warm]) == []


async def test_watches_cut_with_410_gone(stack: LocalStack, http: aiohttp.ClientSession,
                                         recorder: ApiRecorder) -> None:
    await wait_resident(stack, "compacted", "compacted-a")
    restarts = stack.metric("modelpool_extproc_watch_restarts_total")
    emulator(stack, "compact")  # every open watch ends with 410; old versions are gone
    request = asyncio.create_task(attempt(http, stack, "compacted-b"))
    await swap_started(stack, "compacted", "compacted-b")
    emulator(stack, "compact")  # again, mid-swap
    outcome = await request
    assert (outcome.status, outcome.served_by) == (200, "compacted-b"), outcome
    assert stack.metric("modelpool_extproc_watch_restarts_total") > restarts
    await wait_resident(stack, "compacted", "compacted-b")
    back = await attempt(http, stack, "compacted-a")
    assert (back.status, back.served_by) == (200, "compacted-a"), back
    assert await violations_at_rest(stack, recorder, [outcome, back]) == []


async def test_prompt_recovery_after_outage_and_compaction(
        stack: LocalStack, http: aiohttp.ClientSession, recorder: ApiRecorder) -> None:
    await wait_resident(stack, "relisted", "relisted-a")
    emulator(stack, "unavailable", {"on": True})
    try:
        await asyncio.sleep(OUTAGE)
    finally:
        emulator(stack, "unavailable", {"on": False})
    # Wait until every watch of the ext_proc is back (3 kinds x 2 namespaces).
    watches = stack.metric("modelpool_extproc_kube_requests_total", verb="watch", code="200")
    await eventually(lambda: stack.metric("modelpool_extproc_kube_requests_total", verb="watch",
                                          code="200") >= watches + 6,
                     timeout=40, what="the ext_proc's watches to reconnect")
    emulator(stack, "compact")
    request = asyncio.create_task(attempt(http, stack, "relisted-b", timeout=SWAP_BOUND))
    await swap_started(stack, "relisted", "relisted-b")
    emulator(stack, "compact")
    outcome = await request  # the client gives up after SWAP_BOUND
    assert (outcome.status, outcome.served_by) == (200, "relisted-b"), outcome
    assert await violations_at_rest(stack, recorder, [outcome]) == []


async def test_conflicts_on_first_writes(stack: LocalStack, http: aiohttp.ClientSession,
                                         recorder: ApiRecorder) -> None:
    await wait_resident(stack, "conflict", "conflict-a")
    conflicts = stack.metric("modelpool_extproc_kube_requests_total", code="409")
    emulator(stack, "faults/conflict", {"resource": "inferenceservices", "count": 2})
    emulator(stack, "faults/conflict", {"resource": "modelpools", "count": 2})
    outcome = await attempt(http, stack, "conflict-b")
    assert (outcome.status, outcome.served_by) == (200, "conflict-b"), outcome
    assert stack.metric("modelpool_extproc_kube_requests_total", code="409") > conflicts
    await wait_resident(stack, "conflict", "conflict-b")
    assert await violations_at_rest(stack, recorder, [outcome]) == []


async def test_member_in_another_namespace_is_refused(stack: LocalStack,
                                                      http: aiohttp.ClientSession,
                                                      recorder: ApiRecorder) -> None:
    await eventually(lambda: status(stack, "foreign").get("phase") == "Degraded",
                     what="the pool to report Degraded")
    valid = condition(stack, "foreign", "MembersValid")
    assert valid["status"] == "False" and "stranger" in valid["message"], valid
    outcomes = [await attempt(http, stack, "stranger"), await attempt(http, stack, "foreign-a")]
    assert [o.status for o in outcomes] != [200, 200]
    assert all(o.status != 200 for o in outcomes if o.model == "stranger"), outcomes
    # Never touched: no ext_proc write in the other namespace, no pod for the stranger.
    writes = [r for r in stack.api_requests(EXTPROC_USER) if r["namespace"] == ELSEWHERE
              and r["verb"] not in ("get", "list", "watch")]
    assert writes == []
    assert timeline(stack, "stranger", "pod_created") == []
    assert stack.isvc("stranger", ELSEWHERE)["spec"]["replicas"] == 0
    assert await violations_at_rest(stack, recorder, outcomes) == []
