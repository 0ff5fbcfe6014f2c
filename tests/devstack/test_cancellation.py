"""The devstack controllers' waits end when cancelled, whenever the cancel lands.

Python 3.11's ``asyncio.wait_for`` returns the inner result when a ``cancel()`` meets an inner
future that completed in the same few loop turns: a simulator whose member loop was cancelled
just after a watch event set its wake went on running, and the fixture's ``stop()`` waited for
it until pytest-timeout (the hang of test_stuck_stays_creating_until_cleared's teardown).
Here the cancel is landed at every loop turn from 0 to 6 after the event is set, so each of
the windows the old wait had is hit deterministically.
"""

from __future__ import annotations

import asyncio

import pytest

from devstack.simulator_kube import wait_event

TURNS = range(7)  # the old wait swallowed cancels landing 0-2 turns after set(); margin beyond


async def _loop(wake: asyncio.Event, timeout: float | None) -> None:
    """A controller loop: wait for a wake-up (or the requeue timeout), then go round again."""
    while True:
        await wait_event(wake, timeout)
        wake.clear()


@pytest.mark.parametrize("timeout", [0.5, None], ids=["crash-poll", "no-timeout"])
@pytest.mark.parametrize("turns", TURNS)
async def test_a_cancel_meeting_a_wake_up_ends_the_loop(turns: int, timeout: float | None) -> None:
    wake = asyncio.Event()
    task = asyncio.create_task(_loop(wake, timeout))
    await asyncio.sleep(0.01)  # the loop is waiting
    wake.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2)
    assert done, f"the loop survived a cancel {turns} loop turns after its wake-up"
    assert task.cancelled()


async def test_wait_event_reports_a_wake_up_and_a_timeout() -> None:
    wake = asyncio.Event()
    assert await wait_event(wake, 0.01) is False
    wake.set()
    assert await wait_event(wake, 0.01) is True
    assert await wait_event(wake, None) is True
