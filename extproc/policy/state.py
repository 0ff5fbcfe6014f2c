"""The plain state a pool's machine keeps: swap progress, limits, held requests.

Data only; every decision about it is made in ``machine.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum


class PolicyError(RuntimeError):
    """An event that cannot happen in the machine's current state."""


class Stage(str, Enum):
    """Where a swap stands."""

    DRAIN = "Draining"
    PROBE = "Probing"
    UNLOAD = "Unloading"
    LOAD = "Loading"


@dataclass(slots=True)
class Swap:
    """A swap under way: the member that will own the slot and its progress."""

    target: str
    incumbent: str
    started: float
    stage: Stage = Stage.DRAIN
    load_started: float = 0.0
    scaled_down: set[str] = field(default_factory=set)
    scaled_up: bool = False
    # The target's phase when LOAD began: a Failed phase only counts once the member has
    # moved since, so a stale Failed from an earlier attempt does not fail a fresh load.
    phase_at_load: str | None = None
    saw_progress: bool = False
    probing: set[str] = field(default_factory=set)
    probe_retry_at: float = math.inf
    # While the incumbent was busy a moment ago, wait until then before unloading it.
    linger_until: float = math.inf


@dataclass(frozen=True, slots=True)
class Limits:
    """Process-wide policy knobs that a PoolSpec does not carry."""

    swap_timeout: float = 900.0
    failure_backoff: float = 30.0
    retry_after_default: int = 5
    retry_after_max: int = 120
    idle_gate: bool = False
    drain_linger: float = 0.0


@dataclass(slots=True)
class Held:
    """A request waiting for its member to become resident."""

    member: str
    arrived: float
    deadline: float
