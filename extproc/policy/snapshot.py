"""A pool machine's state as the status writer, metrics and logs see it (``PoolView``).

Rules of this file: it owns no state and changes nothing; it reads the pool through
``pool.PoolReader``. Whatever the status shows is derived here, so a change of the view is the
one signal that the status must be written again (the runtime compares views).
"""

from __future__ import annotations

from .admission import held_bound
from .model import MemberObservation, PoolPhase, PoolView
from .pool import PoolReader
from .reclaim import unsupported


def view(m: PoolReader) -> PoolView:
    """A snapshot of ``m``: phase, resident, swap, members, conditions' inputs and counts."""
    missing = m.missing()
    if missing:
        phase = PoolPhase.DEGRADED
    elif m.swap is not None:
        phase = PoolPhase.SWAPPING
    elif m.serving(m.resident):  # the pool's state, not whether this replica may admit
        phase = PoolPhase.READY
    else:
        phase = PoolPhase.PENDING
    failed = next((name for name, t in m.failed_until.items() if t > m.now), "")
    return PoolView(
        key=m.spec.key, phase=phase, resident=m.resident,
        pending=m.swap.target if m.swap else "",
        members=tuple(m.obs.get(name, MemberObservation(name, exists=False, phase=""))
                      for name in m.spec.members),
        generation=m.spec.generation, missing_members=missing,
        deferred_reason=m.deferred[0], deferred_message=m.deferred[1],
        failed_member=failed, failed_message=m.failed_message if failed else "",
        held=len(m.requests.held), in_flight=len(m.requests.in_flight),
        max_held=held_bound(m), resident_idle_since=m.idle_shown,
        unsupported_policy=unsupported(m), stalled=m.swap.stalled if m.swap else "",
        hands_off=m.hands_off)
