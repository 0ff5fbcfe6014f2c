"""Autoscaled members are refused: an autoscaler aimed at a member is a second writer of its
replicas (with Kubernetes 1.37 an HPA may even scale it to zero by itself).

A member that a HorizontalPodAutoscaler or a KEDA ScaledObject targets (the platform says
which: ``MemberObservation.autoscaled_by``) is never swapped in: its requests are answered
503 ``member_autoscaled`` naming the autoscaler, held ones too once it appears, and no wish,
hint or warm-up picks it. The rest of the pool serves on. Deleting the autoscaler restores the
member at its next observation. As LLMKube 0.10.16 refuses them in its reconciler, this holds
in every actuation mode.

Rules of this file: it owns no state; it reads the pool through ``pool.PoolReader``.
"""

from __future__ import annotations

from .events import Command, Notice, Reject
from .model import MemberObservation
from .pool import PoolReader

AUTOSCALED_CODE = "member_autoscaled"


def autoscaler(m: PoolReader, member: str) -> str:
    """The autoscaler aimed at ``member`` ("Kind/name"; "" : none)."""
    obs = m.obs.get(member)
    return obs.autoscaled_by if obs is not None else ""


def message(m: PoolReader, member: str) -> str:
    """Why ``member`` is refused, and what to do about it."""
    return (f"member {member} of pool {m.spec.key} is refused: {autoscaler(m, member)} "
            f"scales it, and a pooled member's replicas are the pool's; delete the "
            f"autoscaler to serve it again")


def reject(m: PoolReader, rid: int, member: str, held_for: float) -> Reject:
    """The answer for a request to an autoscaled member."""
    return Reject(rid, 503, AUTOSCALED_CODE, message(m, member), m.limits.retry_after_default,
                  held_for)


def noticed(m: PoolReader, before: MemberObservation | None, obs: MemberObservation,
            out: list[Command]) -> None:
    """The first time ``obs`` shows an autoscaler: a Warning, and the requests held for the
    member are answered (``m.obs`` already holds ``obs``)."""
    if not obs.autoscaled_by or (before is not None and before.autoscaled_by == obs.autoscaled_by):
        return
    out.append(Notice("MemberAutoscaled", message(m, obs.name), source=obs.name))
    for rid, held in list(m.requests.held.items()):
        if held.member == obs.name:
            m.requests.unhold(rid)
            out.append(reject(m, rid, obs.name, m.now - held.arrived))
