"""Paced release: a member takes at most its capacity of requests at once; the rest stay held.

Off unless ``--paced-release`` is on (``Limits.paced_release``) and the member has a capacity
(``MemberObservation.capacity``: its annotation ``modelpool.inference.llmkube.dev/capacity``,
else the slot count its runtime reports, llama.cpp's ``/slots``). Then:

* a swap's completion releases the target's held requests in arrival order up to its
  capacity, not all at once; the rest stay parked in Envoy and pass, oldest first, as earlier
  ones end (an edge in every stage of ``swap.TRANSITIONS``), each still bounded by its budget;
* in steady state an arrival for the serving member passes only while it has room and no
  older request waits for it, so a saturated member queues here, where the budget clock,
  fairness and Retry-After are ours, not in the model server's queue;
* the room counts every replica: this one's requests in flight on the member plus those each
  live peer publishes in its membership Lease (``replicas.live``). A peer's count is as old
  as its last Lease write, so replicas may together overshoot by what they admitted since.

A paced-held request waits no longer than it would have in the member's own queue, give or
take the time the member needs to take it: it passes the moment a slot frees (the request's
end reaches us as its stream closes).

Rules of this file: it owns no state. Guards read the pool (``pool.PoolReader``); the actions
admit through the machine's own method (``pool.PoolWriter.admit``).
"""

from __future__ import annotations

import math

from . import fairness, replicas
from .events import Command
from .pool import PoolReader, PoolWriter
from .requests import Held



def capacity(m: PoolReader, member: str) -> int:
    """Requests ``member`` takes at once (0: unpaced, as many as come)."""
    obs = m.obs.get(member)
    return obs.capacity if m.limits.paced_release and obs is not None else 0


def in_use(m: PoolReader, member: str) -> int:
    """Requests in flight on ``member``, here and on every live peer."""
    return m.requests.busy(member) + sum(p.in_flight.get(member, 0) for p in replicas.live(m))


def room(m: PoolReader, member: str) -> float:
    """How many more requests ``member`` takes now (inf when unpaced)."""
    cap = capacity(m, member)
    return max(0, cap - in_use(m, member)) if cap else math.inf


def admits(m: PoolReader, member: str) -> bool:
    """An arrival for ``member`` (already routable) may pass: it has room. (Arrival order
    holds without asking for older ones: after every event the edges leave none held while
    a serving member has room, which the policy tests' Driver checks.)"""
    return room(m, member) > 0


def releasable(m: PoolReader, member: str) -> list[tuple[int, Held]]:
    """The held requests for ``member`` that may pass now, oldest first."""
    if not m.routable(member):
        return []
    left = room(m, member)
    held = list(m.requests.held_for(member))
    return held if left == math.inf else held[:int(left)]


def release(m: PoolWriter, member: str, now: float, out: list[Command], swap: str = "") -> int:
    """Admit what ``releasable`` allows (``swap``: the one that released them, if any); return
    how many passed."""
    passing = releasable(m, member)
    for rid, held in passing:
        m.requests.unhold(rid)
        m.admit(rid, member, now - held.arrived, out, swap)
    return len(passing)


def _paced_waiting(m: PoolReader, now: float) -> list[str]:
    """Paced members with held requests that may pass now (a swap under way elsewhere may
    still hold its incumbent's for fairness). O(members): it runs after every event."""
    if not m.limits.paced_release:
        return []
    return [name for name in m.requests.held_by if capacity(m, name) and m.routable(name)
            and room(m, name) > 0 and not fairness.holds(m, name, now)]


def room_freed(m: PoolReader, now: float) -> bool:
    """Guard: a paced member has room for requests held for it."""
    return bool(_paced_waiting(m, now))


def release_freed(m: PoolWriter, now: float, out: list[Command]) -> None:
    """Action: let the held requests into the room that freed, oldest first."""
    for name in _paced_waiting(m, now):
        release(m, name, now, out)
