"""Faults as a user sees them: budget exceeded, a client leaving, a member that cannot start,
and the resident's pod killed out of band. One pool per test, one stack for the module.
"""

from __future__ import annotations

import asyncio

import aiohttp

from devstack.stack import LocalStack
from devstack.testkit import Reply
from e2e_support import (SWAP_BOUND, chat, condition, eventually, kubectl_shows, notices, pools,
                         status, timeline, wait_resident)

SLOW = "3s"  # load delay of the members that must still be loading when something happens
FAIL = "sim.llmkube.dev/fail"
BOTH_MODES = True  # own actuation, and LLMKube's activator beside its reconciler
STACK_DOCS = pools(
    ("budget", ["budget-a", "budget-slow"],
     {"default": "budget-a", "swap_budget": "1s",
      "member_annotations": {"budget-slow": {"sim.llmkube.dev/load-delay": SLOW}}}),
    ("gone", ["gone-a", "gone-slow"],
     {"default": "gone-a",
      "member_annotations": {"gone-slow": {"sim.llmkube.dev/load-delay": SLOW}}}),
    ("broken", ["broken-a", "broken-bad"],
     {"default": "broken-a", "swap_budget": "60s",
      "member_annotations": {"broken-bad": {FAIL: "true"}}}),
    ("lost", ["lost-a", "lost-b"], {"default": "lost-a"}),
)


def error_code(reply) -> str:  # type: ignore[no-untyped-def]
    """The OpenAI error code of an error answer."""
    return reply.json()["error"]["code"]


async def refused(http: aiohttp.ClientSession, stack: LocalStack, model: str, code: str) -> Reply:
    """Ask for ``model``; the answer must be a 503 with error ``code`` and a Retry-After."""
    reply = await chat(http, stack, model)
    assert reply.status == 503, reply.body
    assert error_code(reply) == code
    assert "retry-after" in reply.headers
    return reply


async def test_budget_exceeded_answers_503_and_the_swap_still_completes(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "budget", "budget-a")
    reply = await refused(http, stack, "budget-slow", "swap_budget_exceeded")
    assert int(reply.headers["retry-after"]) >= 1
    assert reply.headers["content-type"].startswith("application/json")
    assert 1.0 <= reply.took < 3.0  # held for the 1 s budget, not for the whole 3 s load

    # Rule 5: the swap is not cancelled; the member comes up and the next request is warm.
    await wait_resident(stack, "budget", "budget-slow")
    await kubectl_shows(stack, "budget", "budget-slow", "Ready")
    [swap] = [n for n in notices(stack, "budget") if n["target"] == "budget-slow"]
    assert swap["released"] == 0  # its only waiter had already been answered
    started = len(notices(stack, "budget", "SwapStarted"))
    warm = await chat(http, stack, "budget-slow")
    assert (warm.status, warm.served_by) == (200, "budget-slow")
    assert len(notices(stack, "budget", "SwapStarted")) == started  # no new swap


async def test_client_leaving_while_held_is_dropped_and_the_swap_goes_on(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "gone", "gone-a")
    held = asyncio.create_task(chat(http, stack, "gone-slow"))
    await eventually(lambda: stack.metric("llmkube_modelpool_held_requests", pool="gone") == 1,
                     what="the request to be held")
    held.cancel()  # the client hangs up mid-hold
    await asyncio.gather(held, return_exceptions=True)

    await eventually(lambda: stack.metric("llmkube_modelpool_held_requests", pool="gone") == 0,
                     what="the held gauge to drop")
    assert stack.metric("modelpool_extproc_hold_duration_seconds_count", pool="gone",
                        outcome="disconnected") == 1
    await wait_resident(stack, "gone", "gone-slow")
    await kubectl_shows(stack, "gone", "gone-slow", "Ready")
    [swap] = [n for n in notices(stack, "gone") if n["target"] == "gone-slow"]
    assert swap["released"] == 0


async def test_member_that_fails_to_start_gets_fast_503s_and_a_failed_status(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "broken", "broken-a")
    reply = await refused(http, stack, "broken-bad", "member_failed")
    assert reply.took < SWAP_BOUND  # told as soon as the load failed, not after the 60 s budget
    assert notices(stack, "broken", "SwapFailed")

    if stack.actuation == "llmkube":
        # LLMKube's reconciler owns the status and the failed member's replicas; the fast
        # answers above and the SwapFailed notice are ours. LLMKube has no handling for a
        # Failed pending member: it keeps broken-bad pending and loads nothing else, so the
        # other member is refused at once, saying so, not held for a swap that cannot run.
        blocked = await refused(http, stack, "broken-a", "pool_blocked")
        assert blocked.took < SWAP_BOUND and "broken-bad" in blocked.body, blocked.body
        # The way out is the cluster's: once broken-bad is fixed it loads, and the pool moves.
        await asyncio.to_thread(stack.annotate, "broken-bad", FAIL, None)
        await wait_resident(stack, "broken", "broken-bad", timeout=SWAP_BOUND + 10)
        back = await chat(http, stack, "broken-a")
        assert (back.status, back.served_by) == (200, "broken-a")
        return
    # The status says why nothing is resident (members[] shows Failed only for a moment: the
    # failed member is scaled back to zero at once, freeing the slot, and then reads Stopped).
    slot = await eventually(
        lambda: (c := condition(stack, "broken", "SlotAllocated")).get("reason") == "MemberFailed"
        and c, what="SlotAllocated to report MemberFailed")
    assert slot["status"] == "False"
    assert "broken-bad" in slot["message"], slot
    assert status(stack, "broken")["residentMember"] == ""
    assert stack.isvc("broken-bad")["spec"]["replicas"] == 0
    await kubectl_shows(stack, "broken", "", "Pending")

    # Within the failure backoff, asking again fails at once instead of thrashing the slot.
    again = await chat(http, stack, "broken-bad")
    assert (again.status, error_code(again)) == (503, "member_failed")
    assert len(notices(stack, "broken", "SwapStarted")) == 2  # the warm-up and the failed one

    # The pool is still usable: the other member comes back.
    back = await chat(http, stack, "broken-a")
    assert (back.status, back.served_by) == (200, "broken-a")
    await kubectl_shows(stack, "broken", "broken-a", "Ready")


async def test_resident_pod_killed_out_of_band_is_swapped_back(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "lost", "lost-a")
    await asyncio.to_thread(stack.annotate, "lost-a", "sim.llmkube.dev/kill-pod", "1")
    await eventually(lambda: notices(stack, "lost", "MemberLost"), what="MemberLost")

    reply = await chat(http, stack, "lost-a")
    assert (reply.status, reply.served_by) == (200, "lost-a")
    assert len(timeline(stack, "lost-a", "pod_killed")) == 1
    assert len(timeline(stack, "lost-a", "pod_created")) == 2  # the original and the new one
    assert timeline(stack, "lost-b", "pod_created") == []  # the slot never went elsewhere
    await kubectl_shows(stack, "lost", "lost-a", "Ready")
