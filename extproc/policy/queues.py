"""The pool's queue as clients may read it: who waits for which member, and for how long.

The read-only endpoint ``GET /pools/<namespace>/<name>`` (docs/operations.md, "The pool's
queue") serves this: per member, the requests held for it and in flight on it (this
replica's), how long the oldest has waited, and the predicted seconds until it serves (the
pool's swap history per (from, to) pair: the swap under way, then one to it). It is the data
``/debug/pools`` shows, shaped as a stable interface: fields are only ever added.

Rules of this file: it owns no state and changes nothing; it reads the pool through
``pool.PoolReader``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .admission import expected_wait
from .pool import PoolReader


@dataclass(frozen=True, slots=True)
class MemberQueue:
    """One member's queue and its predicted wait."""

    name: str
    serving: bool  # requests for it pass at once now
    held: int  # requests held for it here
    in_flight: int  # requests streaming on it from here
    oldest_held_seconds: float  # how long the oldest held for it has waited (0: none)
    predicted_wait_seconds: float  # until it serves: 0 when serving


@dataclass(frozen=True, slots=True)
class PoolQueue:
    """The pool's queue: the slot's owner, the swap under way and every member's queue."""

    resident: str
    swap: str  # "incumbent->target" of the swap under way ("": none)
    swap_seconds: float  # how long the swap under way has run (0: none)
    members: tuple[MemberQueue, ...]


def queue(m: PoolReader) -> PoolQueue:
    """The pool's queue now."""
    book, now = m.requests, m.now
    oldest: dict[str, float] = {}
    for held in book.held.values():  # insertion order is arrival order: first is oldest
        oldest.setdefault(held.member, now - held.arrived)
    swap = m.swap
    return PoolQueue(
        m.resident, f"{swap.incumbent or '(none)'}->{swap.target}" if swap else "",
        now - swap.started if swap else 0.0,
        tuple(MemberQueue(name, m.routable(name), book.held_by.get(name, 0), book.busy(name),
                          oldest.get(name, 0.0), expected_wait(m, name))
              for name in m.spec.members))
