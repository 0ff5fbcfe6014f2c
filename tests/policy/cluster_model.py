"""A deterministic discrete-event model of a pool's members in the cluster, for policy tests.

It plays LLMKube's controller: ``scale`` changes replicas at once and schedules the phase and
pod changes that follow (load, unload); fault helpers change members out of band. Every change
is reported as a ``MemberObservation`` at the model time it happens. Nothing here reads a
clock: the driver asks ``next_time()`` and calls ``advance(now)``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Callable

from extproc.policy.model import PHASE_FAILED, PHASE_READY, PHASE_STOPPED, MemberObservation

PHASE_CREATING = "Creating"
PHASE_PENDING = "Pending"
# How long a killed pod stays away before the controller recreates it (replicas is still 1).
RESTART_DELAY = 1.0

# Load outcomes a member can be configured with.
LOADS = "ok"
FAILS = "fails"  # reaches phase Failed after the load delay
STUCK = "stuck"  # stays Creating for ever


@dataclass(slots=True)
class _Member:
    name: str
    exists: bool = True
    phase: str = PHASE_STOPPED
    replicas: int = 0
    pods: int = 0
    # Bumped by every out-of-band or commanded change, so transitions scheduled for an
    # earlier life of the member are dropped instead of applied to the new one.
    epoch: int = 0
    capacity: int = 0  # what its annotation or runtime says it takes at once (pacing.py)
    carry: bool = False  # its prompt cache is carried over swaps (carry.py)

    def observe(self) -> MemberObservation:
        return MemberObservation(self.name, self.exists, self.phase, self.replicas, self.pods,
                                 self.capacity, self.carry)


class Cluster:
    """Members that react to Scale with configurable load/unload delays and faults."""

    def __init__(self, members: tuple[str, ...], *, load_delay: float = 15.0,
                 unload_delay: float = 3.0, outcome: dict[str, str] | None = None,
                 capacity: dict[str, int] | None = None, carry: frozenset[str] = frozenset()
                 ) -> None:
        self.members = {m: _Member(m, capacity=(capacity or {}).get(m, 0), carry=m in carry)
                        for m in members}
        self.load_delay = load_delay
        self.unload_delay = unload_delay
        self.outcome = dict(outcome or {})
        self.out_of_band = False  # set once a fault put two members up behind the policy
        self._queue: list[tuple[float, int, str, int, Callable[[_Member], None]]] = []
        self._seq = itertools.count()
        self._changed: list[MemberObservation] = []

    def __repr__(self) -> str:
        return (f"Cluster(load_delay={self.load_delay!r}, unload_delay={self.unload_delay!r}, "
                f"outcome={self.outcome!r}, members={list(self.members.values())!r})")

    # ---- what the policy's runtime does ---------------------------------------------------

    def scale(self, name: str, replicas: int, now: float) -> None:
        """Patch ``spec.replicas``, as the runtime's Scale command does."""
        m = self.members[name]
        if not m.exists or m.replicas == replicas:
            return
        m.epoch += 1
        m.replicas = replicas
        if replicas > 0:
            m.pods, m.phase = 1, PHASE_CREATING
            self._schedule_load(m, now)
        else:
            # The pod keeps terminating (and holding GPU memory) for the unload delay.
            self._at(now + self.unload_delay, m, _stopped)
        self._changed.append(m.observe())

    def warm(self, name: str) -> None:
        """Make a member Ready before the test starts, as an earlier process left it."""
        m = self.members[name]
        m.epoch += 1
        m.phase, m.replicas, m.pods = PHASE_READY, 1, 1

    # ---- faults -------------------------------------------------------------------------

    def kill(self, name: str, now: float) -> None:
        """The member's pod dies out of band (OOM, node drain); the controller recreates it."""
        m = self.members[name]
        if not m.exists or m.pods == 0:
            return
        m.epoch += 1
        m.pods, m.phase = 0, PHASE_PENDING
        if m.replicas > 0:
            self._at(now + RESTART_DELAY, m, lambda x: self._restart(x, now + RESTART_DELAY))
        self._changed.append(m.observe())

    def delete(self, name: str) -> None:
        """The member's InferenceService is deleted (its pods go with it)."""
        m = self.members[name]
        m.epoch += 1
        m.exists, m.phase, m.replicas, m.pods = False, "", 0, 0
        self._changed.append(m.observe())

    def recreate(self, name: str) -> None:
        """The member's InferenceService is created again, scaled to zero."""
        m = self.members[name]
        m.epoch += 1
        m.exists, m.phase, m.replicas, m.pods = True, PHASE_STOPPED, 0, 0
        self._changed.append(m.observe())

    def force_up(self, name: str, now: float) -> None:
        """Someone scales a member up behind the policy's back (kubectl scale)."""
        if self.members[name].replicas == 0:
            self.out_of_band = True
        self.scale(name, 1, now)

    # ---- time ---------------------------------------------------------------------------

    def observations(self) -> list[MemberObservation]:
        """Every member as it is now (what a watch's initial list returns)."""
        return [m.observe() for m in self.members.values()]

    def take_changes(self) -> list[MemberObservation]:
        """Observations of changes made since the last call, in order."""
        changed, self._changed = self._changed, []
        return changed

    def next_time(self) -> float:
        """When the next scheduled change happens (inf if none)."""
        return self._queue[0][0] if self._queue else math.inf

    def advance(self, now: float) -> None:
        """Apply every scheduled change due at or before ``now``."""
        while self._queue and self._queue[0][0] <= now:
            _, _, name, epoch, apply = heapq.heappop(self._queue)
            m = self.members[name]
            if m.epoch == epoch:  # else: superseded by a later change to this member
                apply(m)
                self._changed.append(m.observe())

    def up(self) -> list[str]:
        """Members holding (or about to hold) the GPU: replicas > 0 or pods left."""
        return [n for n, m in self.members.items() if m.replicas > 0 or m.pods > 0]

    def ready(self, name: str) -> bool:
        """True when the member serves requests."""
        m = self.members[name]
        return m.exists and m.replicas > 0 and m.phase == PHASE_READY and m.pods > 0

    # ---- internals ----------------------------------------------------------------------

    def _at(self, when: float, m: _Member, apply: Callable[[_Member], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), m.name, m.epoch, apply))

    def _schedule_load(self, m: _Member, now: float) -> None:
        outcome = self.outcome.get(m.name, LOADS)
        if outcome == LOADS:
            self._at(now + self.load_delay, m, _ready)
        elif outcome == FAILS:
            self._at(now + self.load_delay, m, _failed)
        # STUCK: nothing more ever happens

    def _restart(self, m: _Member, now: float) -> None:
        m.pods, m.phase = 1, PHASE_CREATING
        self._schedule_load(m, now)


def _ready(m: _Member) -> None:
    m.phase = PHASE_READY


def _failed(m: _Member) -> None:
    m.phase = PHASE_FAILED


def _stopped(m: _Member) -> None:
    m.pods, m.phase = 0, PHASE_STOPPED


class IdleGate:
    """Answers ProbeIdle: a fixed answer per member, or a script of answers consumed in turn."""

    def __init__(self, default: bool | None = True, delay: float = 0.1) -> None:
        self.default = default
        self.delay = delay
        self.scripts: dict[str, list[bool | None]] = {}
        self.asked: list[str] = []

    def __repr__(self) -> str:
        return f"IdleGate(default={self.default!r}, scripts={self.scripts!r})"

    def answer(self, member: str) -> bool | None:
        """The gate's next answer for ``member``."""
        self.asked.append(member)
        script = self.scripts.get(member)
        return script.pop(0) if script else self.default
