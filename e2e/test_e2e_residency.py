"""Minimum residency through the real stack, in both actuation modes: after a swap, the new
resident's client sending one request after another keeps the slot for its first requests
although a request for the other member waits, then the slot moves and that request is served.
"""

from __future__ import annotations

import asyncio

import aiohttp

from devstack.stack import LocalStack
from e2e_support import chat, pools, wait_resident

BOTH_MODES = True
RESIDENCY = 3
STACK_DOCS = pools(
    ("res", ["res-a", "res-b"], {"default": "res-a", "fairness_window": "20s", "annotations": {
        "modelpool.inference.llmkube.dev/min-residency": str(RESIDENCY)}}))
# a pause between two requests of a client is far below 1.5 s, even on a loaded machine
STACK_OPTIONS = {"extproc_args": ["--drain-linger", "1.5s"]}


async def test_the_new_resident_serves_its_first_requests_while_another_member_waits(
        stack: LocalStack, http: aiohttp.ClientSession) -> None:
    assert (await chat(http, stack, "res-a")).status == 200
    await wait_resident(stack, "res", "res-a")
    first = await chat(http, stack, "res-b")  # held: the swap to res-b
    assert first.status == 200 and "x-modelpool-held-ms" in first.headers
    waiting = asyncio.create_task(chat(http, stack, "res-a"))  # held: the swap back waits
    await asyncio.sleep(0.2)
    followers = [await chat(http, stack, "res-b") for _ in range(RESIDENCY - 1)]
    # one after another, each passes at once: res-b keeps the slot across the pauses
    assert [(r.status, r.served_by, "x-modelpool-held-ms" in r.headers)
            for r in followers] == [(200, "res-b", False)] * (RESIDENCY - 1)
    back = await waiting
    assert back.status == 200 and back.served_by == "res-a"
    assert back.headers["x-modelpool-swap"] == "res-b->res-a"
