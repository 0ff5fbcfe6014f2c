"""Plain value types the three layers exchange: pool specs, member observations, status views.

Nothing here does I/O. The platform layer builds ``PoolSpec`` and ``MemberObservation`` from
Kubernetes objects (or a static file); the policy consumes them and produces a ``PoolView``
that the platform's status writer turns into ``.status`` of the ModelPool.

Rules of this file: frozen value types only; it owns no state and imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class PoolPhase(str, Enum):
    """The ModelPool's lifecycle phase (``status.phase``)."""

    PENDING = "Pending"
    READY = "Ready"
    SWAPPING = "Swapping"
    DEGRADED = "Degraded"


# InferenceService status.phase values that matter to the policy.
PHASE_READY = "Ready"
PHASE_FAILED = "Failed"
PHASE_STOPPED = "Stopped"
# Phases in which the member's controller may still run (or be starting) a workload.
ACTIVE_PHASES = frozenset({"Ready", "Creating", "Progressing", "WaitingForGPU"})


@dataclass(frozen=True, slots=True)
class PoolKey:
    """Identifies a pool: its namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What a ModelPool asks for, already defaulted and validated."""

    key: PoolKey
    members: tuple[str, ...]
    default: str = ""
    swap_budget: float = 300.0
    fairness_window: float = 30.0
    generation: int = 0
    # model name -> member; every member also answers to its own name
    aliases: dict[str, str] = field(default_factory=dict)
    # spec.swapPolicy as written, even a value this version does not implement: the policy
    # decides what it supports and reports the rest, so a newer value never breaks the pool.
    swap_policy: str = "sticky"
    # spec.reclaimAfter: idle seconds before a non-default resident gives the slot back
    reclaim_after: float = 300.0
    # spec.swapDelay: a new resident keeps the slot this long before a swap away unloads it
    # (own mode; fairness.py: the fairness window still bounds every wait; 0: no hold)
    swap_delay: float = 0.0
    # spec.schedulerName: accepted and shown, applied by LLMKube's reconciler ("" : none)
    scheduler_name: str = ""
    # annotation modelpool.inference.llmkube.dev/max-held; None: the process's --max-held
    max_held: int | None = None
    # annotation modelpool.inference.llmkube.dev/resume: a new value ends a hands-off spell now
    resume: str = ""
    # annotation modelpool.inference.llmkube.dev/activation: Wait (hold, swap) or IfIdle
    # (never swap behind a busy incumbent; ifidle.py), for requests that name neither
    activation: str = "Wait"
    # annotation modelpool.inference.llmkube.dev/fallbacks: member -> the routing value of
    # the backend an IfIdle request for it goes to when the incumbent is busy
    fallbacks: dict[str, str] = field(default_factory=dict)
    # annotation modelpool.inference.llmkube.dev/min-residency: requests a new resident serves
    # before it gives the slot up between two of them (residency.py; 0: off)
    min_residency: int = 0
    # annotation modelpool.inference.llmkube.dev/priorities: objective -> priority (higher
    # takes the slot first; priority.py); unnamed objectives are 0
    priorities: dict[str, int] = field(default_factory=dict)
    # model names this pool claims (members, aliases) that an older pool holds: never routed
    # here (platform/kube/claims.py); the pool's status says which pool holds each
    unrouted: tuple[str, ...] = ()


class Actuation(str, Enum):
    """Who carries a pool's swaps out (``--actuation``; see docs/operations.md)."""

    OWN = "own"  # this service drains, unloads, loads and writes the status
    LLMKUBE = "llmkube"  # LLMKube's reconciler does; this service only triggers and follows
    HANDS_OFF = "hands-off"  # own mode after another writer fought us: route, never actuate
    FOLLOW = "follow"  # own mode, another replica of ours leads the pool: hold, publish, follow


@dataclass(frozen=True, slots=True)
class PeerState:
    """Another replica of this service, as its membership Lease shows it for one pool.

    ``silent_since`` is on this process's monotonic clock: when its Lease last changed. A
    ``lost`` peer (silent for its duration + margin) has unknown counts, never zero ones.
    ``acked`` is the pool's drain epoch it has seen and obeys (0: none).
    """

    identity: str
    silent_since: float
    lost: bool = False
    acked: int = 0
    in_flight: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """What the ModelPool's ``.status`` says, as far as routing cares.

    ``foreign``: the fields that say who owns the slot (phase, resident, pending) were changed
    by someone else than this service (the platform compares them with our recent writes).
    ``llmkube``: the status carries a condition type only LLMKube's reconciler writes
    (``MetalSupported``), so that controller manages this pool. A condition some other tool
    added is neither: it is simply kept.
    """

    resident: str = ""
    pending: str = ""
    deferred_reason: str = ""  # SwapDeferred's reason while it is True
    deferred_message: str = ""
    foreign: bool = False
    llmkube: bool = False
    # the field manager that last wrote the slot fields (metadata.managedFields; "": unknown)
    written_by: str = ""


@dataclass(frozen=True, slots=True)
class StartHints:
    """What the cluster remembers of a pool when this process starts watching it.

    A restarted process (or a new leader) resumes from these instead of guessing: the member
    that owned the slot, and the target of a swap that was under way.
    """

    resident: str = ""
    pending: str = ""


@dataclass(frozen=True, slots=True)
class MemberObservation:
    """What the cluster says about one member InferenceService and its pods."""

    name: str
    exists: bool = True
    phase: str = ""
    replicas: int = 0
    pods: int = 0  # pods that exist, terminating ones included: they still hold GPU memory
    # requests it takes at once under paced release (pacing.py; 0: not known, unpaced)
    capacity: int = 0
    # its llama.cpp slots are saved before it unloads and restored when it loads (carry.py)
    carry: bool = False
    # the field manager owning spec.replicas (metadata.managedFields; "": unknown; writers.py)
    replicas_by: str = ""
    # the autoscaler aimed at it, "Kind/name" ("": none; autoscaled.py refuses the member)
    autoscaled_by: str = ""

    @property
    def ready(self) -> bool:
        """True when the member is serving."""
        return self.exists and self.phase == PHASE_READY and self.replicas > 0

    @property
    def unloaded(self) -> bool:
        """True when the member holds no GPU memory: scaled to zero and no pod left.

        The phase must have left the active ones too. The pods and the InferenceService come
        through separate watches: right after a scale-down, the cache can show replicas 0
        and no pods while a replacement pod the controller created a moment earlier is still
        on its way. The controller reports Stopped only once it has torn the workload down,
        so requiring both closes that gap.
        """
        return self.replicas == 0 and self.pods == 0 and self.phase not in ACTIVE_PHASES


@dataclass(frozen=True, slots=True)
class PoolView:
    """A snapshot of one pool for the status writer, metrics and logs."""

    key: PoolKey
    phase: PoolPhase
    resident: str  # "" when no member owns the slot
    pending: str  # the swap target, "" when not mid-swap
    members: tuple[MemberObservation, ...]
    generation: int
    missing_members: tuple[str, ...] = ()
    deferred_reason: str = ""  # "" | "PodsBusy" | "IdleCheckFailed" | ...
    deferred_message: str = ""
    failed_member: str = ""  # the last member that failed to load, while its backoff runs
    failed_message: str = ""
    held: int = 0
    in_flight: int = 0
    max_held: int = 0  # the bound on held requests in force (0: none)
    # When the resident went idle, once it has stayed idle for Limits.idle_report (None
    # otherwise): the machine's clock in the policy, Unix time once the runtime publishes it.
    resident_idle_since: float | None = None
    unsupported_policy: str = ""  # spec.swapPolicy when this version runs it as sticky
    stalled: str = ""  # what a swap that stopped moving is missing ("" when none)
    hands_off: str = ""  # why own mode stopped actuating, naming the other writer ("": it acts)
