"""Turns for the writes of many pools: a bounded few in flight, the ones others wait on first.

A lead taken over a thousand pools writes every status and stamps every member (fencing.py).
All at once, they queue every Lease renew behind them at the API server, renews land too late
and memberships lapse. So they take turns, at most ``limit`` in flight; a status write (the
other replicas wait for it to know the resident) goes before a fence no scale waits for yet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

# The writes in flight at once for a replica's pools (statuses and fences together).
WRITES_IN_FLIGHT = 16


class WriteTurns:
    """At most ``limit`` writes in flight; a waiting ``first`` one goes before the others."""

    def __init__(self, limit: int = WRITES_IN_FLIGHT) -> None:
        self._free = limit
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (
            deque(), deque())

    @contextlib.asynccontextmanager
    async def turn(self, first: bool = True) -> AsyncIterator[None]:
        """Hold a turn for the block; ``first`` ones are let in before the others."""
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
        else:
            queue = self._waiting[0 if first else 1]
            granted = asyncio.get_running_loop().create_future()
            queue.append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release()  # given the turn as it was cancelled: pass it on
                elif granted in queue:  # (a release may have dropped it already)
                    queue.remove(granted)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        for queue in self._waiting:
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._free += 1
