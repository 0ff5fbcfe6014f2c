"""When the members giving up the slot must let it go: the fairness window and the drain linger.

Invariant 5 (``machine.py``): once a swap has waited the pool's ``fairness_window``, new
requests for the incumbent are held too, so the incumbent drains and the waiting requests get
the slot. Until then the incumbent keeps it for its drain linger after its last request
(``requests.RequestBook.linger``: only clients seen coming back earn one, and a client that came
back only after another member served it does not count), since missing a returning client
costs two swaps where waiting costs milliseconds.

Rules of this file: it owns no state and changes nothing; it reads the pool through
``pool.PoolReader``.
"""

from __future__ import annotations

import math

from .pool import PoolReader
from .residency import linger
from .state import Swap


def due(m: PoolReader, swap: Swap, now: float) -> bool:
    """True once ``swap`` has waited its pool's fairness window (never when it is 0)."""
    window = m.spec.fairness_window
    return window > 0 and now - swap.started >= window


def holds(m: PoolReader, member: str, now: float) -> bool:
    """True when ``member`` is the incumbent of a swap that has waited long enough."""
    swap = m.swap
    return swap is not None and swap.target != member and due(m, swap, now)


def calm_at(m: PoolReader) -> float:
    """When the members giving up the slot will have been idle for their drain linger."""
    swap = m.swap
    if swap is None or due(m, swap, m.now):
        return -math.inf
    book, cap = m.requests, m.limits.drain_linger
    return max((book.idle_since(name) + linger(m, name, cap) for name in m.others()),
               default=-math.inf)
