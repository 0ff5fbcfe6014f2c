"""When a pool's machine next needs the clock, and when it is at rest.

Rules of this file: it only reads (``pool.PoolReader`` and the concerns' own reads); it owns no
state. The machine keeps the timer's answer (``PoolMachine.next_deadline``) and, while the pool
is at rest, lets a resident hit or its end be booked in one pass until that deadline.
"""

from __future__ import annotations

from . import carry, fairness, modes, replicas, watchdog
from .pool import PoolReader
from .reclaim import RECLAIMING, idle_deadline
from .state import Stage
from .steps import reask_at
from .steps_llmkube import lost_at


def next_deadline(m: PoolReader, hands: modes.Hands) -> float:
    """The earliest time at which a Tick would change something (inf if none)."""
    times = [m.requests.next_deadline()]
    times.extend(m.failed_until.values())  # the status's failed member clears then
    times.extend(m.landing.deadlines(m.now))  # a write of ours can no longer land then
    times.extend((idle_deadline(m), watchdog.deadline(m),
                  modes.resume_at(m, hands), lost_at(m), *carry.deadlines(m)))
    swap = m.swap
    if swap is not None:
        if swap.stage is Stage.DRAIN:
            times.extend(t for t in (swap.probe_retry_at, fairness.calm_at(m),
                                     *replicas.settle_times(m)) if t > m.now)
        if swap.stage in (Stage.LOAD, Stage.TRIGGERED):
            times.append(swap.load_started + m.limits.swap_timeout)
        if swap.stage is Stage.LOAD:
            times.append(reask_at(m))
    return min(times)


def at_rest(m: PoolReader) -> bool:
    """No swap, nothing held or wished for, no idle clock (sticky), no start-up hint: no edge is enabled until
    the state changes or a deadline comes, and a resident hit changes neither."""
    return m.swap is None and not m.requests.held and not m.wishes \
        and m.spec.swap_policy not in RECLAIMING and not m.hints.pending
