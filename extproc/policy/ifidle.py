"""IfIdle activation: a request that may go elsewhere never makes a busy incumbent give way.

LLMKube's ModelRouter names this ``poolActivation: IfIdle`` (Wait is the default): a request
whose member is not serving would normally be held and start a swap; an IfIdle request does
so only while the slot is idle. When serving it would need a swap and the slot is busy (the
resident has requests in flight on any replica of ours, or a swap to another member is under
way), it is answered at once: routed to the pool's fallback for its member when one is named
(the annotation ``modelpool.inference.llmkube.dev/fallbacks``), else 503
``pool_incumbent_busy`` with Retry-After. Either way no swap starts and no wish is left: the
point is that it costs the incumbent nothing.

A request that joins a swap already under way to its own member is held as usual: that swap
was started by someone else, waiting for it adds no swap.

Rules of this file: it owns no state and changes nothing; it reads the pool through
``pool.PoolReader`` and returns the answer for the machine to record.
"""

from __future__ import annotations

from .events import Divert, Reject
from .pool import PoolReader
from .replicas import live

#: The activations a request or a pool may ask for (LLMKube's spelling).
WAIT, IF_IDLE = "Wait", "IfIdle"
#: The answer's code (LLMKube's reason for the same answer).
BUSY_CODE = "pool_incumbent_busy"


def parse(text: str) -> str:
    """The activation ``text`` names (Wait, IfIdle; any case, ``if-idle`` too), or ValueError."""
    folded = text.strip().lower().replace("-", "").replace("_", "")
    for name in (WAIT, IF_IDLE):
        if folded == name.lower():
            return name
    raise ValueError(f"{text[:64]!r} is not an activation (use Wait or IfIdle)")


def in_flight(m: PoolReader, member: str) -> int:
    """Requests in flight on ``member`` here and on every live replica (their Leases)."""
    return m.requests.busy(member) + sum(p.in_flight.get(member, 0) for p in live(m))


def busy_with(m: PoolReader, member: str) -> str:
    """Why serving ``member`` now would make a busy incumbent give way ("": it would not)."""
    swap = m.swap
    if swap is not None:
        return "" if swap.target == member else f"the slot is already moving to {swap.target!r}"
    resident = m.resident
    if resident in ("", member):
        return ""  # a cold slot, or its own resident coming up: no one to displace
    count = in_flight(m, resident)
    return f"the incumbent {resident!r} is serving {count} request(s)" if count else ""


def refusal(m: PoolReader, rid: int, member: str, activation: str,
            retry_after: int) -> Reject | Divert | None:
    """The answer for an IfIdle request that would displace a busy incumbent, else None."""
    if (activation or m.spec.activation) != IF_IDLE:
        return None
    busy = busy_with(m, member)
    if not busy:
        return None
    fallback = m.spec.fallbacks.get(member, "")
    if fallback:
        return Divert(rid, member, fallback, BUSY_CODE)
    return Reject(rid, 503, BUSY_CODE,
                  f"model {member!r} is not loaded and {busy}; the request asked not to "
                  f"trigger a swap then (activation {IF_IDLE}); retry after Retry-After",
                  retry_after)
