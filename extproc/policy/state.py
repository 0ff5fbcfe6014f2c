"""The plain state a pool's machine keeps: limits, swap progress, the stages of a swap.

Rules of this file: data only, and it imports nothing. ``Swap`` is the record of the swap under
way, owned by the transition table: the edges' actions (``steps.py``, ``steps_llmkube.py``)
change its fields, and the watchdog its marks of progress; the machine starts and ends it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum


class PolicyError(RuntimeError):
    """An event that cannot happen in the machine's current state (a caller or policy bug)."""


class Stage(str, Enum):
    """Where a pool stands: no swap under way, or the stage of the one that is."""

    IDLE = "Idle"
    DRAIN = "Draining"
    PROBE = "Probing"
    UNLOAD = "Unloading"
    LOAD = "Loading"
    TRIGGERED = "Triggered"  # llmkube mode: waiting for LLMKube to make the target resident


@dataclass(frozen=True, slots=True)
class Limits:
    """Process-wide policy knobs that a PoolSpec does not carry.

    No defaults here: the runtime builds Limits from ``Settings`` (``runtime.hub.limits_from``),
    the one place where every tunable and its default is declared.
    """

    swap_timeout: float  # LOAD longer than this fails the swap
    failure_backoff: float  # a failed member fails fast for this long
    retry_after_default: int  # Retry-After without swap history
    retry_after_max: int  # clamp for computed Retry-After
    idle_gate: bool  # ask the incumbent's runtime before unloading it
    drain_linger: float  # wait until the incumbent has been idle this long
    probe_retry: float  # after a busy or failed idle probe, ask again after this long
    max_held: int  # held requests per pool beyond which new ones get 503 at once (0: no bound)
    stall_after: float  # a swap stage with no observed progress this long is SwapStalled
    idle_report: float  # a resident idle this long shows status.residentIdleSince
    lost_replica_wait: float  # a lost replica's requests may stream this long after it fell silent
    activation_grace: float  # llmkube: a trigger with no trace in the cluster this long is lost
    activation_retries: int  # llmkube: lost triggers sent again before the swap is given up
    hands_off_quiet: float  # own: hands-off ends after this long without a foreign write
    paced_release: bool  # a member with a capacity takes at most that many at once (pacing.py)
    carry_timeout: float  # a swap waits this long at most for a slot save or restore (carry.py)
    write_landing: float  # a scale-up or trigger already sent may still land this long (landing.py)


@dataclass(slots=True)
class Swap:
    """A swap under way: the member that will own the slot and its progress."""

    target: str
    incumbent: str
    started: float
    stage: Stage = Stage.DRAIN
    load_started: float = 0.0
    scaled_down: set[str] = field(default_factory=set)
    # The target's phase when LOAD began: a Failed phase only counts once the member has
    # moved since, so a stale Failed from an earlier attempt does not fail a fresh load.
    phase_at_load: str | None = None
    saw_progress: bool = False
    asked_up_at: float = 0.0  # LOAD: when we last asked for the target (steps.target_at_zero)
    probing: set[str] = field(default_factory=set)
    # The first probe answer that was not "idle": (member, False busy / None unknown).
    refused: tuple[str, bool | None] | None = None
    probe_retry_at: float = -math.inf  # after a refused probe, DRAIN waits until then
    reclaim: bool = False  # started by swapPolicy reclaim, not by a request
    followed_epoch: int = 0  # follow mode: the leader's announcement when we began following
    # The watchdog's record (watchdog.py): what the stage last looked like, since when, and
    # what is missing once it stopped moving ("" while it moves).
    progress_mark: tuple[object, ...] = ()
    progress_at: float = 0.0
    stalled: str = ""
    # llmkube mode (steps_llmkube.py): triggers LLMKube dropped so far, and since when the
    # current one has left no trace in the cluster (None while it shows one).
    lost: int = 0
    lost_since: float | None = None
