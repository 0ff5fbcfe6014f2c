"""What goes into a pool's state machine (events) and what comes out (commands).

Events are facts the runtime observed; commands are things the runtime must do. Request ids
are opaque integers chosen by the caller and unique per pool while the request lives.

Rules of this file: frozen value types only; it owns no state and reads only ``model.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import Actuation, MemberObservation, PeerState, PoolSpec, PoolStatus

# ---- events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestArrived:
    """A request for ``member`` wants to pass, waiting at most ``max_wait`` seconds for it."""

    rid: int
    member: str
    max_wait: float = math.inf  # the client's own deadline (header x-modelpool-max-wait)
    activation: str = ""  # Wait or IfIdle (header x-modelpool-activation); "": the pool's
    objective: str = ""  # header x-gateway-inference-objective (the pool maps it: priority.py)
    priority: int | None = None  # header x-modelpool-priority: wins over the objective


@dataclass(frozen=True, slots=True)
class RequestEnded:
    """The request's stream closed: it finished if admitted, or its client left if held."""

    rid: int


@dataclass(frozen=True, slots=True)
class MemberObserved:
    """The cluster's current view of one member changed."""

    obs: MemberObservation


@dataclass(frozen=True, slots=True)
class SpecChanged:
    """The ModelPool's spec (members, default, budget, fairness) changed."""

    spec: PoolSpec


@dataclass(frozen=True, slots=True)
class IdleProbed:
    """Answer of the idle gate for ``member``: True idle, False busy, None unreachable."""

    member: str
    idle: bool | None


@dataclass(frozen=True, slots=True)
class StatusObserved:
    """The ModelPool's ``.status`` changed (read in llmkube mode; a foreign write in own mode
    is a conflict)."""

    status: PoolStatus


@dataclass(frozen=True, slots=True)
class ActuationChanged:
    """The pool is carried out by someone else from now on (auto mode's choice, or a fight)."""

    actuation: Actuation
    reason: str


@dataclass(frozen=True, slots=True)
class AdmissionLease:
    """This replica may admit until ``until`` (its membership Lease: last renew sent +
    duration - margin, on the machine's clock); inf where no Leases are used."""

    until: float


@dataclass(frozen=True, slots=True)
class LeadershipChanged:
    """This replica gained or lost the pool's leader Lease (own mode: lead or follow)."""

    leading: bool


@dataclass(frozen=True, slots=True)
class PeersObserved:
    """The other replicas' membership Leases, as far as this pool is concerned."""

    peers: tuple[PeerState, ...]


@dataclass(frozen=True, slots=True)
class DrainAnnounced:
    """The pool's drain announcement in its leader Lease: every replica admits only to
    ``target`` from epoch ``epoch`` on ("" with any epoch: no announcement; epoch 0: none
    known). The leader hears its own once written and not superseded; followers by watch."""

    epoch: int
    target: str


@dataclass(frozen=True, slots=True)
class CarryAnswered:
    """The runtime carried out ``CarrySlots`` for ``member``: ``step`` ("save" or "restore")
    took effect (``ok``), or it failed, with what it found (``detail``)."""

    member: str
    step: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class WishesDropped:
    """The runtime dropped every ``Scale`` wish of ours (hands-off, or the lead lost).
    ``reached``: per member, the number of our latest ``Scale`` ask (counted from 1 per
    member) whose scale-up may have reached the API server; a member left out: none did."""

    reached: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; deadlines up to now are due."""


@dataclass(frozen=True, slots=True)
class Close:
    """The pool stops being served (removed, or the process is stopping).

    Every held request is rejected with 503 ``code`` now, and any request that would be held
    from here on is rejected the same way; requests for the serving resident still pass.
    """

    code: str
    message: str


Event = (RequestArrived | RequestEnded | MemberObserved | SpecChanged | IdleProbed | StatusObserved
         | ActuationChanged | AdmissionLease | LeadershipChanged | PeersObserved | DrainAnnounced
         | CarryAnswered | WishesDropped | Tick | Close)

# ---- commands ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """Let request ``rid`` through to ``member``."""

    rid: int
    member: str
    held_for: float = 0.0  # seconds it was held; 0 when admitted at once
    swap: str = ""  # the swap that released it, "incumbent->target" ("": none, or not known)


@dataclass(frozen=True, slots=True)
class Hold:
    """Park request ``rid`` until a later Admit or Reject; it must end by ``deadline``."""

    rid: int
    member: str
    deadline: float
    coalesced: bool  # joined a swap that was already under way for this member


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer request ``rid`` with an error: status, OpenAI error code, message, Retry-After."""

    rid: int
    status: int
    code: str
    message: str
    retry_after: int
    held_for: float = 0.0


@dataclass(frozen=True, slots=True)
class Divert:
    """Send request ``rid`` for ``member`` to the pool's fallback ``to`` (a routing value)
    instead: it is decided, and not counted in flight on any member."""

    rid: int
    member: str
    to: str
    reason: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """A held request's client left before it was decided; it is forgotten (count it)."""

    rid: int
    member: str
    held_for: float


@dataclass(frozen=True, slots=True)
class Scale:
    """Set ``member``'s replicas."""

    member: str
    replicas: int


@dataclass(frozen=True, slots=True)
class Trigger:
    """Ask LLMKube's reconciler to make ``member`` resident: its ``spec.replicas`` 0 -> 1 only,
    with a resourceVersion precondition (llmkube mode; the reconciler does the rest)."""

    member: str


@dataclass(frozen=True, slots=True)
class ProbeIdle:
    """Ask ``member``'s runtime whether it is idle; answer with IdleProbed."""

    member: str


@dataclass(frozen=True, slots=True)
class CarrySlots:
    """Save (``step`` "save") or restore (``step`` "restore") the prompt cache of
    ``member``'s llama.cpp slots (policy/carry.py); answer with ``CarryAnswered``."""

    member: str
    step: str


@dataclass(frozen=True, slots=True)
class Notice:
    """Something operators should hear about (an Event, a log line, a metric).

    kind is one of SwapStarted, SwapCompleted, SwapFailed, SwapDeferred, MemberLost,
    ActuationChanged, SwapCancelled, Reclaimed, UnsupportedSwapPolicy, SwapStalled,
    SwapResumed, ActivationLost, PromptCacheCarried, PromptCacheCarryFailed, StreamsCut,
    IdleProbeMisread (``released``: the requests in flight on this replica that the probe's
    answer endangered), ReplicasWritten (a member's replicas set by ``writer``), MemberAutoscaled.
    """

    kind: str
    message: str
    source: str = ""
    target: str = ""
    duration: float = 0.0
    released: int = 0
    writer: str = ""  # the other field manager it is about (writers.py; "": none)


Command = (Admit | Hold | Reject | Divert | Dropped | Scale | Trigger | ProbeIdle | CarrySlots
           | Notice)

# Notice kinds that mean something is wrong for the pool's users: Warning Events and logs.
WARNING_NOTICES = ("SwapFailed", "MemberLost", "SwapStalled", "UnsupportedSwapPolicy",
                   "ActivationLost", "PromptCacheCarryFailed", "StreamsCut", "IdleProbeMisread",
                   "ReplicasWritten", "MemberAutoscaled")


def is_warning(notice: Notice) -> bool:
    """Whether operators must look: a warning kind, or a pool handed off in a fight."""
    return notice.kind in WARNING_NOTICES or (
        notice.kind == "ActuationChanged" and notice.target == Actuation.HANDS_OFF.value)
