"""A pool's spec changed: members that left may still hold the GPU; their held requests end."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import Command, Reject
from .model import PoolSpec
from .state import PolicyError

if TYPE_CHECKING:
    from .machine import PoolMachine

Out = list[Command]


def respec(m: PoolMachine, spec: PoolSpec, out: Out) -> None:
    """Take a new spec: departing members keep counting for the slot, their held requests end."""
    if spec.key != m.spec.key:
        raise PolicyError(f"spec for {spec.key} sent to pool {m.spec.key}")
    m.spec = spec
    m.version += 1
    for name in list(m.obs):
        if name in spec.members:
            m.departing.discard(name)  # added back
        elif m.obs[name].unloaded and not m.requests.busy(name):
            del m.obs[name]
        else:
            # Removed while it holds the GPU (or serves requests): it still counts for
            # the slot until it is drained and unloaded like any other non-target member.
            m.departing.add(name)
    # Requests for members that left the pool can never be served.
    for rid, held in list(m.requests.held.items()):
        if held.member not in spec.members:
            m.requests.unhold(rid)
            out.append(Reject(rid, 404, "model_not_found",
                              f"model {held.member!r} was removed from pool {spec.key}",
                              0, m.now - held.arrived))
    if m.resident and m.resident not in spec.members:
        m.resident = ""
    m.wishes = {w: None for w in m.wishes if w in spec.members}
    # A swap whose target left is cancelled by its edge in swap.TRANSITIONS.
