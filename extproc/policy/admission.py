"""Refusing a request at once instead of holding it: the client's own deadline, the pool's bound.

Both answer 503 + Retry-After without parking. A request refused for its deadline still leaves
a *wish* for its member (``PoolMachine.wishes``), so the swap starts and the retry is served
warm; one refused by the bound does not (the bound sheds load, it must not add swaps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import Command, Reject

if TYPE_CHECKING:
    from .machine import PoolMachine


def expected_wait(m: PoolMachine, member: str) -> float:
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


def held_bound(m: PoolMachine) -> int:
    """Held requests the pool takes at most (0: no bound): its annotation, else the setting."""
    return m.spec.max_held if m.spec.max_held is not None else m.limits.max_held


def refuse_now(m: PoolMachine, rid: int, member: str, max_wait: float,
               out: list[Command]) -> bool:
    """Answer a request that would be held with 503 now when it cannot wait; True if so."""
    wait = expected_wait(m, member)
    if wait > max_wait:
        if m.swap is None or m.swap.target != member:
            m.wishes[member] = None  # the swap starts anyway: the retry finds it warm
        out.append(Reject(rid, 503, "max_wait_exceeded",
                          f"model {member!r} is expected to be ready in {wait:.0f}s, longer "
                          f"than the request's x-modelpool-max-wait ({max_wait:g}s); it is "
                          "being loaded, retry after Retry-After", m.history.clamp(wait)))
        return True
    bound = held_bound(m)
    if bound and len(m.requests.held) >= bound:
        out.append(Reject(rid, 503, "too_many_held",
                          f"pool {m.spec.key} already holds {bound} requests waiting for a "
                          "swap; retry after Retry-After", m.history.clamp(wait)))
        return True
    return False
