"""Priorities through the real stack, in both actuation modes: while the slot moves to one
member, requests wait for two others; the one with the higher priority (x-modelpool-priority,
or its x-gateway-inference-objective mapped by the pool) gets the slot next although it came
later."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from devstack.stack import LocalStack
from e2e_support import chat, notices, pools, wait_resident

BOTH_MODES = True
STACK_DOCS = pools(("prio", ["prio-a", "prio-b", "prio-c", "prio-d"], {
    "default": "prio-a", "annotations": {
        "modelpool.inference.llmkube.dev/priorities": "critical=10,batch=-5"}}))
# raising a priority is the operator's to allow: here the gateway is trusted with the headers
STACK_OPTIONS = {"extproc_args": ["--client-priority", "trust"]}


@pytest.mark.parametrize("urgent", [{"x-modelpool-priority": "5"},
                                    {"x-gateway-inference-objective": "critical"}])
async def test_the_higher_priority_takes_the_slot_next(
        stack: LocalStack, http: aiohttp.ClientSession, urgent: dict[str, str]) -> None:
    assert (await chat(http, stack, "prio-a")).status == 200
    await wait_resident(stack, "prio", "prio-a")
    before = len(notices(stack, "prio", "SwapStarted"))
    first = asyncio.create_task(chat(http, stack, "prio-b"))  # the swap a -> b starts
    await asyncio.sleep(0.1)
    older = asyncio.create_task(chat(http, stack, "prio-c"))
    await asyncio.sleep(0.1)
    later = asyncio.create_task(chat(http, stack, "prio-d", headers=urgent))
    replies = await asyncio.gather(first, older, later)
    assert [r.status for r in replies] == [200, 200, 200]
    assert [r.served_by for r in replies] == ["prio-b", "prio-c", "prio-d"]
    started = [n["target"] for n in notices(stack, "prio", "SwapStarted")[before:]]
    assert started[:3] == ["prio-b", "prio-d", "prio-c"], started
    assert replies[2].ended < replies[1].ended  # d answered before c, though it came later
    # back to the default for the next case
    assert (await chat(http, stack, "prio-a")).status == 200


async def test_a_bad_priority_is_a_400(stack: LocalStack, http: aiohttp.ClientSession) -> None:
    reply = await chat(http, stack, "prio-a", headers={"x-modelpool-priority": "high"})
    assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_priority"
