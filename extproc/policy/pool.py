"""What a policy concern may see of a pool's machine, and what an edge may ask it to change.

Rules of this file: it owns no state, and it imports only the value types and the records that
import nothing of the policy's rules (``model``, ``state``, ``events``, ``requests``,
``forecast``, ``landing``): nothing of the machine or of any concern, so every concern can
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

from .carrybook import CarryBook
from .events import Command
from .forecast import SwapHistory
from .landing import Landing
from .model import Actuation, MemberObservation, PeerState, PoolSpec, PoolStatus, StartHints
from .requests import RequestBook
from .state import Limits, Stage, Swap


class PoolReader(Protocol):
    """A view of one pool's machine, as concerns see it: read only (only ``machine.py``
    assigns these; tests/policy/test_layers.py checks it)."""

    # Given, and the time of the event being handled.
    spec: PoolSpec
    limits: Limits
    now: float
    # What the cluster showed: the members, and the pool's .status.
    @property
    def obs(self) -> Mapping[str, MemberObservation]:
        """The members as the cluster last showed them."""

    status: PoolStatus
    # Who owns the slot, and the swap under way (None: Idle).
    resident: str
    swap: Swap | None
    @property
    def stage(self) -> Stage:
        """Idle, or the swap's stage."""

    actuation: Actuation  # who carries the swaps out (``modes.Hands``)
    # The records other concerns keep, each changed by its own methods.
    requests: RequestBook
    history: SwapHistory
    carry: CarryBook  # the saves and restores the swap waits for (carry.py)
    # What the machine remembers between events.
    hints: StartHints  # what the cluster remembered at start-up
    owner_picked: bool  # a request, an adoption or a warm-up picked an owner
    @property
    def failed_until(self) -> Mapping[str, float]:
        """A member that failed to load -> the end of its backoff."""

    failed_message: str  # why the last load failed
    deferred: tuple[str, str]  # why the swap waits: (reason, message), or ("", "")
    @property
    def wishes(self) -> Mapping[str, None]:
        """Members wanted by requests refused for their own deadline."""

    departing: set[str]  # members removed from the spec that may still hold the GPU
    landing: Landing  # members a scale-up or trigger of ours may still bring up (landing.py)
    closing: tuple[str, str] | None  # (code, message) once the pool closes
    # Read back from ``replicas.Fleet``.
    drain: tuple[int, str]  # the drain announcement in force: (epoch, target)
    admit_until: float  # this replica admits nothing from then on
    peers: tuple[PeerState, ...]  # the other replicas' membership Leases
    # Read back from ``reclaim.PolicyMemory``.
    resident_since: float  # when the resident took the slot
    idle_shown: float | None  # the status's residentIdleSince (None: not shown)
    hands_off: str  # why own mode stopped actuating, while the status is ours to say so

    def routable(self, member: str) -> bool:
        """May requests for ``member`` pass now?"""

    def serving(self, member: str) -> bool:
        """Resident and Ready (and, llmkube or follow, nothing else coming in)."""

    def others(self) -> list[str]:
        """The members that must give up the slot for the swap under way."""

    def missing(self) -> tuple[str, ...]:
        """Members that do not exist (the pool is Degraded)."""

    def retry_after(self) -> int:
        """Seconds a client should wait before retrying."""


class PoolWriter(PoolReader, Protocol):
    """What the transition table's actions may change of the machine, each by a method."""

    def set_resident(self, member: str, since: float | None = None) -> None:
        """``member`` owns the slot ("" : none); ``since`` given, its idle clock starts then."""

    def pick_owner(self) -> None:
        """An owner was picked: a cold pool no longer warms spec.default."""

    def begin_swap(self, swap: Swap) -> None:
        """``swap`` is under way from now on."""

    def end_swap(self) -> None:
        """No swap is under way any more."""

    def forget_wish(self, member: str) -> None:
        """A swap to ``member`` starts: the wish for it is granted."""

    def set_pending_hint(self, member: str) -> None:
        """Resume a swap to ``member`` next ("" : the hint is used up)."""

    def record_failure(self, member: str, until: float, reason: str) -> None:
        """``member`` failed to load: requests for it fail fast until ``until``."""

    def clear_failure(self, member: str) -> None:
        """``member`` loaded: its failure backoff ends now."""

    def admit(self, rid: int, member: str, held_for: float, out: list[Command],
              swap: str = "") -> None:
        """Let ``rid`` through to ``member`` (released by ``swap``, "incumbent->target")."""

    def scale(self, member: str, replicas: int, out: list[Command]) -> None:
        """Ask for ``member`` at ``replicas``."""

    def defer(self, reason: str, message: str, out: list[Command]) -> None:
        """Record why the swap waits."""

    def clear_deferral(self) -> None:
        """The swap moves again."""
