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

from .model import Actuation
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
    """When the members giving up the slot will have been idle for their drain linger, and
    the resident has held it for spec.swapDelay (``held_until``)."""
    swap = m.swap
    if swap is None or due(m, swap, m.now):
        return -math.inf
    book, cap = m.requests, m.limits.drain_linger
    lingered = max((book.idle_since(name) + linger(m, name, cap) for name in m.others()),
                   default=-math.inf)
    window = m.spec.fairness_window
    # never past the fairness window: the swap stops waiting for them then (``due``)
    return min(max(lingered, held_until(m)), swap.started + window if window > 0 else math.inf)


def held_until(m: PoolReader) -> float:
    """spec.swapDelay: until when the resident keeps the slot against a cross-model swap
    (-inf: no hold). Own mode only: in llmkube mode LLMKube's reconciler honours the field,
    and this service follows its status. The fairness window still bounds every wait:
    ``calm_at`` stops counting once the swap has waited it."""
    delay, resident = m.spec.swap_delay, m.resident
    if not delay or m.actuation is not Actuation.OWN or not resident \
            or m.swap is None or m.swap.target == resident:
        return -math.inf
    return m.resident_since + delay
