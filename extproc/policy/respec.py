"""A pool's spec changed: members that left may still hold the GPU; their held requests end.

Rules of this file: it owns no state. It reads the pool through ``pool.PoolReader``, answers
the held requests that can never be served (through the request book), and returns what the
machine changes (``Respec``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import Command, Reject
from .model import PoolSpec
from .pool import PoolReader
from .state import PolicyError

Out = list[Command]


@dataclass(frozen=True, slots=True)
class Respec:
    """What a new spec changes of the machine besides the spec itself."""

    departing: frozenset[str]  # removed members that still count for the slot
    forgotten: tuple[str, ...]  # removed members gone for good: their observations go


def respec(m: PoolReader, spec: PoolSpec, out: Out) -> Respec:
    """Take a new spec: departing members keep counting for the slot, their held requests end."""
    if spec.key != m.spec.key:
        raise PolicyError(f"spec for {spec.key} sent to pool {m.spec.key}")
    departing, forgotten = set(m.departing), []
    for name in m.obs:
        if name in spec.members:
            departing.discard(name)  # added back
        elif m.obs[name].unloaded and not m.requests.busy(name) \
                and not m.landing.may_land(name, m.now):
            # (one a Scale or trigger of ours may still bring up stays: forgotten, it came up
            # with nobody tracking it; the search's llmkube-warm-edit checks it)
            forgotten.append(name)
        else:
            # Removed while it holds the GPU (or serves requests): it still counts for
            # the slot until it is drained and unloaded like any other non-target member.
            departing.add(name)
    # Requests for members that left the pool can never be served.
    for rid, held in list(m.requests.held.items()):
        if held.member not in spec.members:
            m.requests.unhold(rid)
            out.append(Reject(rid, 404, "model_not_found",
                              f"model {held.member!r} was removed from pool {spec.key}",
                              0, m.now - held.arrived))
    # A swap whose target left is cancelled by its edge in swap.TRANSITIONS.
    return Respec(frozenset(departing), tuple(forgotten))
