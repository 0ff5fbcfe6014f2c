"""What a policy concern may see of a pool's machine, and what an edge may ask it to change.

Rules of this file: it imports nothing of the machine or of any concern, so every concern can
type against it without a circle of imports (tests/policy/test_layers.py checks that).
``PoolMachine`` (``machine.py``) is the one class that satisfies both protocols.

* ``PoolReader`` is read only: the pool's spec, limits and clock, what the cluster showed, the
  swap under way, and the few values a concern keeps that another one reads (``drain``,
  ``admit_until`` and ``peers`` of ``replicas.Fleet``, ``resident_since`` and ``idle_shown`` of
  ``reclaim.PolicyMemory``). A concern changes its own dataclass, which it is handed
  explicitly, and nothing it reads here.
* ``PoolWriter`` adds the machine's own changes that the edges of ``swap.TRANSITIONS`` (and the
  change of hands in ``modes.py``) make: who is resident, which swap is under way, a failure's
  backoff, a deferral, an admission or a replica change. Each is a method of the machine, so
  every write to the machine's state is in ``machine.py``.

The swap under way (``state.Swap``) is the table's own record: the edges' actions (and the
watchdog's mark) change its fields directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .events import Command
from .forecast import SwapHistory
from .model import Actuation, MemberObservation, PeerState, PoolSpec, PoolStatus, StartHints
from .requests import RequestBook
from .state import Limits, Stage, Swap


class PoolReader(Protocol):
    """A read-only view of one pool's machine, as concerns see it."""

    @property
    def spec(self) -> PoolSpec: """The pool's spec."""
    @property
    def limits(self) -> Limits: """Process-wide policy knobs."""
    @property
    def now(self) -> float: """The time of the event being handled."""
    @property
    def actuation(self) -> Actuation: """Who carries the pool's swaps out."""
    @property
    def status(self) -> PoolStatus: """The pool's ``.status`` as last observed."""
    @property
    def obs(self) -> Mapping[str, MemberObservation]: """The members as last observed."""
    @property
    def resident(self) -> str: """The member owning the slot ("" for none)."""
    @property
    def swap(self) -> Swap | None: """The swap under way (None: Idle)."""
    @property
    def stage(self) -> Stage: """Idle, or the stage of the swap under way."""
    @property
    def requests(self) -> RequestBook: """Held and in-flight requests (the book's own methods change it)."""
    @property
    def history(self) -> SwapHistory: """Past swap durations."""
    @property
    def hints(self) -> StartHints: """What the cluster remembered at start-up."""
    @property
    def owner_picked(self) -> bool: """Whether a request, an adoption or a warm-up picked an owner."""
    @property
    def failed_until(self) -> Mapping[str, float]: """Members whose load failed -> end of backoff."""
    @property
    def failed_message(self) -> str: """Why the last load failed."""
    @property
    def deferred(self) -> tuple[str, str]: """Why the swap waits (reason, message), or ("", "")."""
    @property
    def wishes(self) -> Mapping[str, None]: """Members wanted by requests refused for their deadline."""
    @property
    def departing(self) -> frozenset[str] | set[str]: """Members removed from the spec that may hold the GPU."""
    @property
    def closing(self) -> tuple[str, str] | None: """(code, message) once the pool closes."""
    @property
    def drain(self) -> tuple[int, str]: """The drain announcement in force: (epoch, target)."""
    @property
    def admit_until(self) -> float: """This replica admits nothing from then on."""
    @property
    def peers(self) -> tuple[PeerState, ...]: """The other replicas' membership Leases."""
    @property
    def resident_since(self) -> float: """When the resident took the slot."""
    @property
    def idle_shown(self) -> float | None: """The status's residentIdleSince (None: not shown)."""

    def routable(self, member: str) -> bool: """May requests for ``member`` pass now?"""
    def serving(self, member: str) -> bool: """Resident and Ready (and nothing else coming in)."""
    def others(self) -> list[str]: """The members that must give up the slot for the swap."""
    def missing(self) -> tuple[str, ...]: """Members that do not exist (the pool is Degraded)."""
    def calm_at(self) -> float: """When the members giving up the slot are calm."""
    def retry_after(self) -> int: """Seconds a client should wait before retrying."""


class PoolWriter(PoolReader, Protocol):
    """What the transition table's actions may change of the machine, each by a method."""

    def set_resident(self, member: str, since: float | None = None) -> None:
        """``member`` owns the slot; ``since`` given, its idle clock starts then."""
    def pick_owner(self) -> None: """An owner was picked: spec.default is not warmed any more."""
    def begin_swap(self, swap: Swap) -> None: """``swap`` is under way from now on."""
    def end_swap(self) -> None: """No swap is under way any more."""
    def set_pending_hint(self, member: str) -> None: """Resume a swap to ``member`` ("" : none)."""
    def record_failure(self, member: str, until: float, reason: str) -> None:
        """``member`` failed to load: it fails fast until ``until``."""
    def clear_failure(self, member: str) -> None: """``member`` loaded: its backoff ends."""
    def admit(self, rid: int, member: str, held_for: float, out: list[Command]) -> None:
        """Let ``rid`` through to ``member``."""
    def scale(self, member: str, replicas: int, out: list[Command]) -> None:
        """Ask for ``member`` at ``replicas``."""
    def defer(self, reason: str, message: str, out: list[Command]) -> None:
        """Record why the swap waits."""
    def clear_deferral(self) -> None: """The swap moves again."""
