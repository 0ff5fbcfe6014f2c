"""Refusing a request instead of holding it: at its arrival, and at its deadline.

A request that is not admitted at once is held, unless it is answered 503 + Retry-After now:
this replica may not admit (its admission Lease ran out), its member failed to load or cannot
be loaded (a blocked llmkube pool), the pool is Degraded, closing or hands-off, the client's
own deadline is shorter than the expected wait, or the pool holds as many requests as it may
(``too_many_held``: a capacity condition of the pool, as the swap budget is). At the held
bound a request of negative priority, "sheddable" in the Gateway API inference extension's
terms, is answered 429 + Retry-After instead (``request_shed``), as the Endpoint Picker
Protocol asks for a sheddable request dropped under load.
An IfIdle request that would displace a busy incumbent is answered too, or sent to its
member's fallback (``ifidle.py``).
A request refused for its deadline still leaves a *wish* for its member (``Refusal.wish``;
``PoolMachine.wishes``), so the swap starts and the retry is served warm; one refused by the
bound does not (the bound sheds load, it must not add swaps). A held request whose swap
budget runs out is told only what is true of the swap (``budget_exceeded``).

Past the held bound, a held request of negative priority is shed for a higher-priority
newcomer (``shed``, after every event; priority.py): 429 ``request_shed`` as well.

Rules of this file: it owns no state. It reads the pool through ``pool.PoolReader`` (and
``modes.Hands``, for when a hands-off spell ends) and returns the answers; the machine records
them (a held request, a wish). ``shed`` alone answers held requests through the book, as every
concern that answers them does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import ifidle, modes, pacing, priority, replicas
from .events import Command, Divert, Reject, RequestArrived
from .model import Actuation
from .pool import PoolReader, PoolWriter
from .requests import Held
from .steps_llmkube import blocked_reject, blocker


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered at once, and whether its member is wished for all the same."""

    answer: Reject | Divert
    wish: bool = False  # the swap starts anyway: the retry finds it warm


def expected_wait(m: PoolReader, member: str) -> float:
    """Seconds until ``member`` should be serving, from the pool's swap history."""
    if m.routable(member):
        return 0.0
    history, swap = m.history, m.swap
    if swap is None:
        return history.expected(m.resident, member)
    rest = history.expected(swap.incumbent, swap.target, m.now - swap.started)
    if swap.target == member:
        return rest
    return rest + history.expected(swap.target, member)  # this swap, then one to it


def held_bound(m: PoolReader) -> int:
    """Held requests the pool takes at most (0: no bound): its annotation, else the setting."""
    return m.spec.max_held if m.spec.max_held is not None else m.limits.max_held


def refusal(m: PoolReader, hands: modes.Hands, arrival: RequestArrived) -> Refusal | None:
    """The answer for a request that is not admitted at once, if it must not be held."""
    now, rid, member = m.now, arrival.rid, arrival.member
    if now >= m.admit_until:
        return Refusal(Reject(rid, 503, replicas.UNAVAILABLE_CODE,
                              replicas.unavailable_message(), 1))
    failed_until = m.failed_until.get(member, 0.0)
    if failed_until > now:
        return Refusal(Reject(rid, 503, "member_failed",
                              f"model {member!r} failed to load: {m.failed_message}",
                              max(1, math.ceil(failed_until - now))))
    if blocker(m) not in ("", member):
        return Refusal(blocked_reject(m, rid, member, 0.0))
    if m.missing():
        return Refusal(Reject(rid, 503, "pool_degraded",
                              f"pool {m.spec.key} is degraded: member(s) "
                              f"{', '.join(m.missing())} do not exist",
                              m.limits.retry_after_default))
    if m.closing is not None:
        return Refusal(Reject(rid, 503, *m.closing, m.retry_after()))
    if m.actuation is Actuation.HANDS_OFF:
        return Refusal(modes.conflict_reject(m, hands, rid, 0.0))
    busy = ifidle.refusal(m, rid, member, arrival.activation,
                          m.history.clamp(expected_wait(m, member)))
    if busy is not None:
        return Refusal(busy)
    return _cannot_wait(m, rid, member, arrival.max_wait, arrival)


def _cannot_wait(m: PoolReader, rid: int, member: str, max_wait: float,
                 arrival: RequestArrived) -> Refusal | None:
    wait = expected_wait(m, member)
    if wait > max_wait:
        return Refusal(Reject(rid, 503, "max_wait_exceeded",
                              f"model {member!r} is expected to be ready in {wait:.0f}s, "
                              f"longer than the request's x-modelpool-max-wait "
                              f"({max_wait:g}s); it is being loaded, retry after Retry-After",
                              m.history.clamp(wait)),
                       wish=m.swap is None or m.swap.target != member)
    bound = held_bound(m)
    if bound and len(m.requests.held) >= bound and not sheddable(m, arrival):
        return Refusal(_bound_reject(m, rid, priority.of(m.spec, arrival), "",
                                     m.history.clamp(wait)))
    return None


def _bound_reject(m: PoolReader, rid: int, rank: int, why: str, retry_after: int,
                  held_for: float = 0.0) -> Reject:
    """The held bound's answer to a request of priority ``rank``, refused or shed: 429
    request_shed when the priority is negative (sheddable), else 503 too_many_held."""
    holds = f"pool {m.spec.key} holds {held_bound(m)} requests waiting for a swap{why}"
    if rank < 0:
        return Reject(rid, 429, "request_shed", f"{holds}: this one (priority {rank}) is "
                      "sheddable and is shed; retry after Retry-After", retry_after, held_for)
    return Reject(rid, 503, "too_many_held", f"{holds}; retry after Retry-After",
                  retry_after, held_for)


def sheddable(m: PoolReader, arrival: RequestArrived) -> bool:
    """A held request of negative priority, below ``arrival``'s, may make room for it under
    the held bound (``priority.shed`` answers it)."""
    rank = priority.of(m.spec, arrival)
    return any(h.priority < min(0, rank) for h in m.requests.held.values())


def budget_exceeded(m: PoolReader, rid: int, held: Held) -> Reject:
    """The answer for a held request whose swap budget ran out."""
    return Reject(rid, 503, "swap_budget_exceeded",
                  f"model {held.member!r} did not become ready within the pool's swap budget "
                  f"({m.spec.swap_budget:g}s); {_swap_state(m, held.member)}", m.retry_after(),
                  m.now - held.arrived)


def _swap_state(m: PoolReader, member: str) -> str:
    """What a request refused at its budget is told of the swap: only what is true."""
    swap = m.swap
    if pacing.capacity(m, member) and m.routable(member):
        return (f"it serves, at its capacity of {pacing.capacity(m, member)} requests at once "
                "(paced release); retry after Retry-After")
    if swap is None:
        return "no swap is under way for it now; retry after Retry-After"
    if swap.stalled:
        return f"the swap to {swap.target} is stalled: {swap.stalled}"
    if m.deferred[0]:
        return f"the swap to {swap.target} is deferred: {m.deferred[1]}"
    if swap.target != member:
        return f"the swap to {swap.target} under way comes first; retry shortly"
    return "the swap continues, retry shortly"


def shed(m: PoolWriter, out: list[Command]) -> None:
    """After every event: past the held bound, the lowest negative-priority held requests
    (newest among equals) are answered 429 request_shed (only those: see sheddable)."""
    bound, book = held_bound(m), m.requests
    if not bound or len(book.held) <= bound:
        return
    victims = sorted(((h.priority, -i, rid) for i, (rid, h) in enumerate(book.held.items())
                      if h.priority < 0))[:len(book.held) - bound]
    for _, _, rid in victims:
        held = book.unhold(rid)
        out.append(_bound_reject(m, rid, held.priority, " and a higher-priority one came",
                                 m.retry_after(), m.now - held.arrived))
