"""What the LLMKube stand-in decides for one ModelPool: the owner, replica changes, the status.

Rules of this file: no I/O. The reconciler (``devstack.reconciler``) gathers a `PoolView`
(the pool, its member InferenceServices, the namespace's Models, how many pods each member
has, terminating ones included) and the idle probe's answers, and this module turns them into
a `Plan`. Written from the behaviour of LLMKube's ModelPoolReconciler
(docs/design/llmkube.md, and facts checked against its source), never from its code.

Theory of operation, one pass:

1. Refusals first. A member reference that does not resolve makes the pool Degraded
   (``MembersValid`` MissingMembers); a member whose ``spec.modelRef`` Model asks for a
   ``metal`` accelerator makes it Degraded too (``MetalSupported`` MetalMembersUnsupported; a
   Model that does not exist counts as not metal). Either way no replica is touched.
   A member that an autoscaler targets is refused on its own (our reading of LLMKube 0.10.16's
   "reject autoscaled ModelPool members"): the reconciler leaves it out of the pass (never the
   owner, its replicas never touched: the autoscaler has them) and says so in ``MembersValid``
   (AutoscaledMembers); the other members are reconciled as usual.
2. Owner. A member asking for replicas (``spec.replicas >= 1``, absent counts as 1) that is
   not ``status.residentMember`` is a fresh activation and becomes the owner; among several,
   the recorded ``status.pendingMember`` if it is one of them, else the first in spec order,
   so a newer scale-up takes over from a pending owner held at 0. With no fresh activation a
   recorded pending member stays the owner (the pass holds it at 0, which would otherwise
   erase the signal), else the resident (a warm pool never goes cold, but under
   ``swapPolicy: reclaim-down``, our reading of LLMKube 0.11, a resident the reconciler saw
   idle for ``spec.reclaimAfter`` is released: no owner, so it is probed and goes to 0 and the
   status names no resident). A cold pool continues its pending member, else honours the
   default (not under reclaim-down: that pool stays cold until asked), else the first
   scaled-up member.
   A pending member that reports Failed gets no special treatment: it stays the owner.
3. ``spec.swapDelay`` (our reading of LLMKube 0.11's "add spec.swapDelay to hold cross-model
   swaps"): a Ready resident whose ``SlotAllocated`` condition turned True less than
   ``swapDelay`` ago keeps the slot against a swap to another owner. It is neither probed nor
   scaled down, the owner is held at 0 and named pending, and ``SwapDeferred`` says
   ``SwapDelay``; ``SlotAllocated`` stays True for the resident meanwhile, so the hold is timed
   from when it became resident, not from the swap's request. A pass after the hold swaps.
4. Every other non-owner that is Ready (``status.phase == Ready``, nothing else) is probed; a busy
   or unanswered probe defers the swap (``SwapDeferred`` PodsBusy / IdleCheckFailed) and
   leaves that member alone. Every other non-owner goes to 0.
5. The owner goes to 1 only when every non-owner was cleared and has no pod left; otherwise
   it is held at 0, even when it is the serving resident.
6. Status: Ready with the owner resident once the owner is Ready; else Swapping with the
   owner pending (a cold start says Swapping with the default pending); Pending only with no
   owner at all. Conditions are set in place (others' conditions stay), and only the fields
   that changed against the cached copy are patched (`status_patch`).
"""

from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass, field
from typing import Any

from devstack.simulator_member import desired_replicas
from extproc.platform.kube.objects import REPLICAS_FIELD, field_owner
from extproc.policy.writers import OUR_MANAGER
from extproc.settings import parse_duration

METAL_ACCELERATOR = "metal"  # a Model's spec.hardware.accelerator for a Mac agent's member
# LLMKube's own writers of member replicas: its operator (a kubebuilder binary, "manager") and
# the activator in front of the pool, which this service plays (its trigger is how a request
# asks for a member, so it is no outsider)
INSIDE_LLMKUBE = ("manager", OUR_MANAGER)
RECLAIM_DOWN = "reclaim-down"  # swapPolicy: an idle pool's slot is released (LLMKube 0.11)
DEFERRED_MESSAGES = {
    "PodsBusy": "Swap deferred: incumbent still serving in-flight requests",
    "IdleCheckFailed": "Swap deferred: incumbent idleness could not be established "
                       "(fail-closed)",
    "SwapDelay": "Swap deferred: the resident holds the slot for spec.swapDelay",
}


@dataclass(frozen=True)
class PoolView:
    """One pool as a pass sees it: the object, its members (None: missing), pods and Models."""

    pool: dict[str, Any]
    members: dict[str, dict[str, Any] | None]  # in spec order
    pods: dict[str, int]  # pods present per member, terminating ones included
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # the namespace's, by name
    # members left out of ``members`` because an autoscaler targets them: member -> autoscaler
    autoscaled: dict[str, str] = field(default_factory=dict)
    released: bool = False  # reclaim-down: the resident was seen idle for spec.reclaimAfter

    @property
    def status(self) -> dict[str, Any]:
        """The pool's status as cached."""
        return self.pool.get("status") or {}


@dataclass
class Plan:
    """What one pass does: replica patches, the status it wants, whether to look again soon."""

    owner: str | None
    replicas: dict[str, int] = field(default_factory=dict)
    deferred: str = ""  # PodsBusy / IdleCheckFailed, "" when nothing is deferred
    status: dict[str, Any] = field(default_factory=dict)
    requeue: bool = False


def member_names(pool: dict[str, Any]) -> list[str]:
    """The members' InferenceService names, in spec order."""
    names = [((m or {}).get("inferenceServiceRef") or {}).get("name")
             for m in (pool.get("spec") or {}).get("members") or []]
    return [n for n in names if n]


def phase_of(isvc: dict[str, Any] | None) -> str:
    """The member's ``status.phase`` ("" when it has none yet)."""
    return ((isvc or {}).get("status") or {}).get("phase") or ""


def is_ready(isvc: dict[str, Any] | None) -> bool:
    """Phase Ready: the only thing LLMKube's reconciler looks at (not readyReplicas)."""
    return phase_of(isvc) == "Ready"


def is_metal(isvc: dict[str, Any] | None, models: dict[str, dict[str, Any]]) -> bool:
    """True when the member's ``spec.modelRef`` Model asks for a metal accelerator."""
    ref = ((isvc or {}).get("spec") or {}).get("modelRef")
    model = models.get(ref) if ref else None
    hardware = ((model or {}).get("spec") or {}).get("hardware") or {}
    return hardware.get("accelerator") == METAL_ACCELERATOR


def resolve_owner(view: PoolView) -> str | None:
    """The member that should own the slot (step 2 of the theory above)."""
    present = [n for n, isvc in view.members.items() if isvc is not None]
    resident = view.status.get("residentMember") or ""
    pending = view.status.get("pendingMember") or ""
    spec = view.pool.get("spec") or {}
    default = spec.get("default") or ""
    requested = [n for n in present if desired_replicas(view.members[n]) >= 1]
    if not resident:
        if pending in present:
            return pending
        if not requested:
            warm = spec.get("swapPolicy") != RECLAIM_DOWN
            return default if warm and default in present else None
        return default if default in requested else requested[0]
    fresh = [n for n in requested if n != resident]
    if fresh:
        return pending if pending in fresh else fresh[0]
    if pending in present:
        return pending
    return None if view.released else resident


def reclaims_down(view: PoolView) -> str:
    """The resident whose idleness the reconciler times under reclaim-down ("" : none): a
    Ready resident that stays the owner, no other member asked for."""
    resident = view.status.get("residentMember") or ""
    if (view.pool.get("spec") or {}).get("swapPolicy") != RECLAIM_DOWN \
            or not is_ready(view.members.get(resident)) or resolve_owner(view) != resident:
        return ""
    return resident


def swap_delay(pool: dict[str, Any]) -> float:
    """``spec.swapDelay`` in seconds (absent or not a duration: 0, no hold)."""
    try:
        return parse_duration(str((pool.get("spec") or {}).get("swapDelay") or 0))
    except ValueError:
        return 0.0


def held_resident(view: PoolView, owner: str | None, now: str) -> str:
    """The resident that keeps the slot against a swap to ``owner`` under ``spec.swapDelay``
    ("" : none): Ready, and resident (``SlotAllocated`` True) for less than the delay."""
    resident = view.status.get("residentMember") or ""
    delay = swap_delay(view.pool)
    if not delay or not owner or owner == resident or not is_ready(view.members.get(resident)):
        return ""
    slot = next((c for c in view.status.get("conditions") or []
                 if c.get("type") == "SlotAllocated" and c.get("status") == "True"), None)
    since = (slot or {}).get("lastTransitionTime")
    if not since:
        return ""
    return resident if _seconds(now) - _seconds(since) < delay else ""


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def needs_idle_check(view: PoolView, owner: str | None, now: str) -> list[str]:
    """Every Ready non-owner, whatever its replicas, but a resident held by ``spec.swapDelay``:
    each is probed before it may go to 0."""
    held = held_resident(view, owner, now)
    return [n for n, isvc in view.members.items()
            if n not in (owner, held) and is_ready(isvc)]


def scaled_up_outside(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    """The field manager outside LLMKube that scaled a member up from ``before`` to ``after``
    ("" : none), named from ``managedFields`` as LLMKube 0.10.16 reports it (#2356)."""
    if before is None or desired_replicas(after) <= desired_replicas(before):
        return ""
    manager = field_owner(after, REPLICAS_FIELD)
    return "" if not manager or manager in INSIDE_LLMKUBE else manager


def scaled_up_message(member: str, replicas: int, manager: str) -> str:
    """The Warning Event's message for a member scaled up outside LLMKube."""
    return (f'Member "{member}" was scaled up to {replicas} by field manager "{manager}", '
            "outside LLMKube")


def plan(view: PoolView, idle: dict[str, bool | None], now: str) -> Plan:
    """Decide one pass. `idle` answers the probe per member (None or absent: could not tell)."""
    missing = sorted(n for n, isvc in view.members.items() if isvc is None)
    if missing:
        return _refused(view, "MembersValid", "MissingMembers",
                        f"Member InferenceServices not found: [{' '.join(missing)}]", now,
                        requeue=True)
    metal = sorted(n for n, isvc in view.members.items() if is_metal(isvc, view.models))
    if metal:
        return _refused(view, "MetalSupported", "MetalMembersUnsupported",
                        "Metal-backed members are not supported in v1 (k8s GPU gating only): "
                        f"[{' '.join(metal)}]", now, requeue=False)
    owner = resolve_owner(view)
    held = held_resident(view, owner, now)
    result = Plan(owner)
    clear = True
    for name, isvc in view.members.items():
        if name == owner:
            continue
        if name == held:
            result.deferred, clear = "SwapDelay", False
            continue
        if is_ready(isvc) and idle.get(name) is not True:
            # Unloading a server mid-generation would cut a client off; unknown counts as busy.
            result.deferred = "PodsBusy" if idle.get(name) is False else "IdleCheckFailed"
            clear = False
            continue
        if desired_replicas(isvc) != 0:
            result.replicas[name] = 0
        if view.pods.get(name):
            clear = False  # a terminating pod still holds GPU memory
    swapping = bool(result.deferred)
    owner_isvc = view.members.get(owner) if owner else None
    if owner_isvc is not None:
        # Held at 0 until the others' pods are gone, the serving resident included.
        wanted = 1 if clear else 0
        swapping = swapping or not clear or not is_ready(owner_isvc)
        if desired_replicas(owner_isvc) != wanted:
            result.replicas[owner] = wanted
    result.requeue = swapping or (owner is not None and not is_ready(owner_isvc))
    result.status = _managed_status(view, owner, swapping, result.deferred, now, held)
    return result


def _refused(view: PoolView, kind: str, reason: str, message: str, now: str, *,
             requeue: bool) -> Plan:
    status = copy.deepcopy(view.status)
    status["members"] = [_member_entry(n, isvc, False) for n, isvc in view.members.items()]
    status["phase"] = "Degraded"
    _set_generation(view, status)
    _set_condition(view, status, kind, False, reason, message, now)
    return Plan(None, status=status, requeue=requeue)


def _managed_status(view: PoolView, owner: str | None, swapping: bool, deferred: str,
                    now: str, held: str) -> dict[str, Any]:
    status = copy.deepcopy(view.status)
    owner_ready = owner is not None and is_ready(view.members.get(owner))
    status["members"] = [_member_entry(n, isvc, n == owner and is_ready(isvc))
                         for n, isvc in view.members.items()]
    if owner_ready:
        status.update(phase="Ready", residentMember=owner, pendingMember="")
    elif owner is not None:
        # The resident stays recorded until the owner serves; a cold warm-up says Swapping.
        status.update(phase="Swapping" if swapping else "Pending", pendingMember=owner)
    else:
        status.update(phase="Pending", residentMember="", pendingMember="")
    if owner_ready or held:
        _set_condition(view, status, "SlotAllocated", True, "Resident",
                       f'Member "{owner if owner_ready else held}" owns the shared GPU slot',
                       now)
    else:
        _set_condition(view, status, "SlotAllocated", False, "Swapping",
                       "No member resident yet", now)
    if view.autoscaled:
        _set_condition(view, status, "MembersValid", False, "AutoscaledMembers",
                       "Autoscaled members are refused: [" + " ".join(
                           f"{m}({a})" for m, a in sorted(view.autoscaled.items())) + "]", now)
    else:
        _set_condition(view, status, "MembersValid", True, "AllResolved",
                       "All member references resolve", now)
    _set_condition(view, status, "SwapDeferred", bool(deferred), deferred or "NotDeferred",
                   DEFERRED_MESSAGES.get(deferred, "No swap is being deferred"), now)
    _set_condition(view, status, "MetalSupported", True, "KubernetesGPU",
                   "All members are k8s GPU-gated", now)
    _set_generation(view, status)
    return _omit_empty(status)


def _member_entry(name: str, isvc: dict[str, Any] | None, resident: bool) -> dict[str, Any]:
    # As LLMKube serializes it: empty phase and a false resident are left out.
    entry: dict[str, Any] = {"name": name}
    if phase_of(isvc):
        entry["phase"] = phase_of(isvc)
    if resident:
        entry["resident"] = True
    return entry


def _set_generation(view: PoolView, status: dict[str, Any]) -> None:
    generation = (view.pool.get("metadata") or {}).get("generation")
    if generation:
        status["observedGeneration"] = generation


def _set_condition(view: PoolView, status: dict[str, Any], kind: str, ok: bool, reason: str,
                   message: str, now: str) -> None:
    """Set one condition in place, as Kubernetes' SetStatusCondition does: the others (this
    reconciler's and anyone else's) stay, and the transition time moves only with the status."""
    conditions = status.setdefault("conditions", [])
    value = "True" if ok else "False"
    entry = next((c for c in conditions if c.get("type") == kind), None)
    if entry is None:
        entry = {"type": kind}
        conditions.append(entry)
    if entry.get("status") != value or not entry.get("lastTransitionTime"):
        entry["lastTransitionTime"] = now
    entry.update(status=value, reason=reason, message=message)
    generation = (view.pool.get("metadata") or {}).get("generation")
    if generation:
        entry["observedGeneration"] = generation


def _omit_empty(status: dict[str, Any]) -> dict[str, Any]:
    # An empty member name is "none" and is not serialized (Go's omitempty).
    return {k: v for k, v in status.items()
            if not (k in ("residentMember", "pendingMember") and not v)}


def status_patch(current: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """The merge patch turning `current` into `wanted`: changed fields only, None deletes."""
    patch: dict[str, Any] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({k: None for k in current if k not in wanted})
    return patch
