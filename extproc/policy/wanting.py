"""Which member the slot should go to next: what requests ask for, and what the pool needs.

Rules of this file: it owns no state and only reads the machine (``pool.PoolReader``, and the
read-only rules of ``priority`` and ``replicas``). ``steps`` starts swaps on it and gives a
reclaim up on it; ``steps_llmkube`` asks it whether LLMKube keeps the pool blocked.
"""

from __future__ import annotations

from . import autoscaled, priority, replicas
from .model import PHASE_FAILED, Actuation
from .pool import PoolReader
from .reclaim import RECLAIM_DOWN


def llmkube_blocked(m: PoolReader) -> str:
    """The failed member LLMKube keeps pending ("" if none): its reconciler has no handling
    for a Failed pending member (docs/design/llmkube.md), so no other member can load until
    that one is fixed or the pending field is cleared. Nothing we trigger would move the pool."""
    pending = m.status.pending
    obs = m.obs.get(pending)
    if m.actuation is not Actuation.LLMKUBE or obs is None or obs.phase != PHASE_FAILED:
        return ""
    return pending


def wanted(m: PoolReader) -> str:
    """The member the slot should go to next, or "" to stay put (never an autoscaled one)."""
    choice = asked_for(m) or _tidy(m)
    return "" if autoscaled.autoscaler(m, choice) else choice


def asked_for(m: PoolReader) -> str:
    """The member requests ask for (held, refused, hinted, or held by peers), "" if none."""
    if m.now >= m.admit_until or replicas.peers_release_first(m):
        return ""  # past its admission Lease this replica's view may be stale: start nothing
    if llmkube_blocked(m):
        return ""  # LLMKube keeps a failed member pending: no trigger would move the pool
    hint = m.hints.pending
    if hint in m.spec.members and not m.routable(hint) and not autoscaled.autoscaler(m, hint):
        return hint  # resume the swap a previous process (or leader) started
    for held in priority.precedence(m):  # highest priority first (aged: oldest), then oldest
        if not m.routable(held.member):
            return held.member
    for member in m.wishes:  # requests refused for their own deadline (admission.py)
        if not m.routable(member):
            return member
    for member in replicas.peer_demand(m):  # other replicas hold requests for it
        if not m.routable(member) and not autoscaled.autoscaler(m, member):
            return member
    return ""


def _tidy(m: PoolReader) -> str:
    """Own mode, nothing asked for: the member the pool itself needs up ("" if none)."""
    if m.actuation is not Actuation.OWN or m.now >= m.admit_until \
            or replicas.peers_release_first(m) or llmkube_blocked(m):
        return ""  # LLMKube's reconciler warms the default and keeps one member up
    scaled = [name for name in m.spec.members if m.obs[name].replicas > 0]
    if m.routable(m.resident) and len(scaled) > 1:
        return m.resident  # a second member was scaled up behind our back: undo it
    if not m.resident and not m.owner_picked and m.spec.default \
            and m.spec.swap_policy != RECLAIM_DOWN and all(o.unloaded for o in m.obs.values()):
        return m.spec.default  # cold pool: warm the default member (reclaim-down: stay cold)
    return ""
