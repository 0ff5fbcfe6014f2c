"""spec.swapDelay through the real stack, in both actuation modes: a swap asked for right after
a member became resident waits until that member has held the slot for swapDelay, then serves
the request that asked for it, within its budget. Own mode: this service holds the drain;
llmkube mode: LLMKube's reconciler (the stand-in) holds the swap, says so in SwapDeferred
(reason SwapDelay), and this service follows its status."""

from __future__ import annotations

import time

import aiohttp
import pytest

from e2e_support import chat, notices, pools, start_stack, timeline, wait_resident

SWAP_DELAY = 8.0  # long enough that a loaded machine still asks within the hold
# the stand-in stamps the residency in whole seconds (a condition's lastTransitionTime), so its
# hold may end up to a second before swapDelay has passed since the member's Ready
STAMP = 1.0


@pytest.mark.parametrize("actuation", ["own", "llmkube"])
async def test_a_swap_right_after_a_member_became_resident_waits_for_swap_delay(
        tmp_path_factory, http: aiohttp.ClientSession, actuation: str) -> None:
    pool = f"sd-{actuation}"
    a, b = f"{pool}-a", f"{pool}-b"
    stack = start_stack(tmp_path_factory.mktemp(pool),
                        pools((pool, [a, b], {"default": a, "swapDelay": f"{SWAP_DELAY:g}s",
                                              "swap_budget": "60s"})),
                        actuation=actuation)
    try:
        await wait_resident(stack, pool, a, timeout=30)
        [ready] = timeline(stack, a, "ready")
        assert time.monotonic() < ready["t"] + SWAP_DELAY - STAMP, \
            "the swap must be asked for while the hold is on (the stack answered too late)"
        reply = await chat(http, stack, b)  # held until the hold ends and b loads, then served
        assert (reply.status, reply.served_by) == (200, b), reply.body
        assert "x-modelpool-held-ms" in reply.headers
        # a kept the slot: its unload began only once it had held it for swapDelay
        [unload] = timeline(stack, a, "pod_terminating")
        assert unload["t"] >= ready["t"] + SWAP_DELAY - STAMP, (ready, unload)
        [loaded] = timeline(stack, b, "ready")
        assert loaded["t"] > unload["t"]  # and one member at a time, as in any swap
        await wait_resident(stack, pool, b, timeout=30)
        if actuation == "llmkube":
            assert [n for n in notices(stack, pool, "SwapDeferred")
                    if n.get("source") == "SwapDelay"], "the stand-in said why it held"
    finally:
        stack.stop()
