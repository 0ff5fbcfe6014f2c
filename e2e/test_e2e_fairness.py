"""Interleaved traffic for two members of one pool: swaps are batched, and waits are bounded.

Busy clients for both members at once is the thrash case: without batching every request
would flip the slot. With a fairness window W the incumbent keeps serving until a
cross-model request has waited W, then drains, and the slot moves once for everyone waiting.
The traffic runs once (bounded in time and count); each test checks one property of it.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import pytest

from devstack.stack import LocalStack
from e2e_support import Reply, chat, client, notices, pools

WINDOW = 2.0  # the pool's fairness window
DURATION = 15.0  # how long the clients keep sending
CLIENTS = 2  # busy clients per member
MAX_REQUESTS = 300  # per client: bounds each loop by count as well as by time
TOKENS, TOKEN_MS = 4, 50  # each request streams ~0.2 s on its member
MEMBERS = ("fair-a", "fair-b")
BOTH_MODES = True  # own actuation, and LLMKube's activator beside its reconciler
STACK_DOCS = pools(("fair", list(MEMBERS),
                    {"default": "fair-a", "fairness_window": f"{WINDOW:g}s"}))


@dataclass
class Run:
    """What the interleaved traffic produced."""

    replies: list[Reply]
    swaps: list[dict[str, Any]]  # SwapCompleted notices during the run


async def busy_client(http: Any, stack: LocalStack, model: str, until: float) -> list[Reply]:
    """Send back-to-back streamed requests for `model` until the deadline (or the count cap)."""
    replies: list[Reply] = []
    while time.monotonic() < until and len(replies) < MAX_REQUESTS:
        replies.append(await chat(http, stack, model, stream=True, tokens=TOKENS,
                                  token_delay_ms=TOKEN_MS))
    return replies


async def interleave(stack: LocalStack) -> list[Reply]:
    """CLIENTS busy clients per member, all at once, for DURATION seconds."""
    async with client() as http:
        # warm: the default member is resident before the clients start
        assert (await chat(http, stack, "fair-a")).status == 200
        until = time.monotonic() + DURATION
        batches = await asyncio.gather(*(busy_client(http, stack, m, until)
                                         for m in MEMBERS for _ in range(CLIENTS)))
    return [r for batch in batches for r in batch]


@pytest.fixture(scope="module")
def run(stack: LocalStack) -> Run:
    """The traffic, run once for the module (its own event loop: a sync module fixture)."""
    before = len(notices(stack, "fair"))
    replies = asyncio.run(interleave(stack))
    return Run(replies, notices(stack, "fair")[before:])


def test_every_request_is_served_whole_by_its_member(run: Run) -> None:
    assert all(r.status == 200 for r in run.replies), \
        [r.body for r in run.replies if r.status != 200]
    assert {r.served_by for r in run.replies} == set(MEMBERS)
    assert all(r.events[-1] == "[DONE]" and len(r.events) == TOKENS + 2 for r in run.replies)


def test_nobody_waits_past_the_window_plus_the_swaps(run: Run) -> None:
    # A request whose member is not resident waits at most the fairness window (the
    # incumbent keeps serving that long at most), the incumbent's drain (one in-flight
    # request) and the swap; one that arrives while the slot is already moving to the other
    # member first waits for that swap too. Plus its own service time and a margin for a
    # loaded 2-core machine. Swap durations are measured, so a slow machine widens the bound.
    service = TOKENS * TOKEN_MS / 1000
    longest_swap = max(n["duration_s"] for n in run.swaps)
    worst = max(r.took for r in run.replies)
    assert worst <= WINDOW + 2 * longest_swap + 2 * service + 1.0, (worst, longest_swap)


def test_swaps_are_batched(run: Run) -> None:
    # Runs of answers from one member, in completion order: a batched slot serves its
    # members' busy clients many times per residency, not just the requests that waited.
    ordered = sorted(run.replies, key=lambda r: r.ended)
    runs = [len(list(group)) for _, group in itertools.groupby(r.served_by for r in ordered)]
    assert statistics.median(runs) >= 2 * CLIENTS, runs
    assert 2 <= len(run.swaps) <= DURATION / WINDOW + 2, len(run.swaps)
