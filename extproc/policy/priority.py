"""Priorities that decide swap order: the highest-priority waiting member takes the slot next.

A request's priority is its ``x-modelpool-priority`` header (an integer), else what the pool's
annotation ``modelpool.inference.llmkube.dev/priorities`` (``critical=10,batch=-5``) maps its
``x-gateway-inference-objective`` to (the Gateway API inference extension's objective), else 0.
Both come from clients: the protocol layer passes on only what ``--client-priority`` grants
them (by default a priority below 0, never above), so what arrives here is trusted as it is.
When the slot is free to move, the next swap targets the member of the held request with the
highest priority, the oldest among equals (``wanting.wanted``); with no priorities anywhere that
is the oldest held request, as before.

The fairness window still bounds every wait (docs/guarantees.md): a request that has been held
for the pool's fairness window is *aged* and goes before every request that is not, oldest
aged first, whatever the priorities. So a held request is chosen at the latest at the first
swap decision after it has waited the window, behind only the aged requests older than it, at
most one per other member (each served by one swap), so its wait is at most the window plus
(members) swaps of the fairness bound. A window of 0 turns ageing off (priorities alone).

Under the held bound (``--max-held``, annotation ``max-held``) a negative priority is shed
first: a newcomer that outranks a held request of negative priority is held all the same
(``admission.sheddable``), and after the event the lowest-priority held requests (newest among
equals) beyond the bound are answered 429 ``request_shed`` (``admission.shed``), as is a
newcomer of negative priority that outranks nobody; one of priority 0 or more that finds the
bound full is answered 503 ``too_many_held``.

Rules of this file: it owns no state and changes nothing; it reads the pool through
``pool.PoolReader`` (the priority of each held request is the request book's).
"""

from __future__ import annotations

from .events import RequestArrived
from .model import PoolSpec
from .pool import PoolReader
from .requests import Held


def of(spec: PoolSpec, arrival: RequestArrived) -> int:
    """The priority of a request for ``spec``'s pool."""
    if arrival.priority is not None:
        return arrival.priority
    return spec.priorities.get(arrival.objective, 0)


def precedence(m: PoolReader) -> list[Held]:
    """The held requests in the order they take the slot: aged (held a fairness window) by
    age, then by priority, highest first, oldest among equals."""
    window, now = m.spec.fairness_window, m.now
    held = list(m.requests.held.values())  # insertion order is arrival order
    if not any(h.priority for h in held):
        return held  # (the usual case, kept cheap: oldest first)
    order = {id(h): i for i, h in enumerate(held)}

    def rank(h: Held) -> tuple[bool, int, int]:
        aged = window > 0 and now - h.arrived >= window
        return (not aged, 0 if aged else -h.priority, order[id(h)])
    return sorted(held, key=rank)

