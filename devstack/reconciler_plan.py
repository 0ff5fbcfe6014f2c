"""What the LLMKube stand-in decides for one ModelPool: the owner, replica changes, the status.

Rules of this file: no I/O. The reconciler (``devstack.reconciler``) gathers a `PoolView`
(the pool, its member InferenceServices, how many pods each member has, terminating ones
included) and the idle probe's answers, and this module turns them into a `Plan`. Written
from the behaviour LLMKube's ModelPoolReconciler shows (shared/docs/LLMKUBE.md), not from its
code.

Theory of operation, one pass:

1. Owner. A member asking for replicas (``spec.replicas >= 1``, absent counts as 1) that is
   not ``status.residentMember`` is a request to own the slot; the incoming owner is kept in
   ``status.pendingMember`` and honoured while this pass holds it at 0. A pending owner stays
   the owner until it is resident (a triggered swap completes), so a second early request is
   held at 0 like any non-owner; only a pending owner that reports Failed gives way to one. With nothing requested the resident owns the slot, even when
   someone scaled it to 0 (a warm pool never goes cold again); a cold pool warms
   ``spec.default``.
2. Non-owners go to 0, except a Ready one that is busy or whose idleness cannot be checked:
   that defers the swap (``SwapDeferred`` PodsBusy / IdleCheckFailed), never forces it.
3. The owner goes to 1 only once every other member's pods are gone; an owner scaled up early
   (by an activator) is patched back to 0 meanwhile.
4. The whole status is rewritten from what was seen.

A pool with a missing member, or with a Metal-backed member (it runs outside the cluster, so
its replicas mean nothing here), is Degraded and gets no replica change at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devstack.simulator_member import desired_replicas

# Metal members run on a Mac agent outside the cluster. LLMKube learns that from the member's
# Model; this stand-in has no Model objects and reads the member's own `spec.accelerator`.
METAL_ACCELERATOR = "metal"


@dataclass(frozen=True)
class PoolView:
    """One pool as a pass sees it: the object, its members (None: missing), their pod counts."""

    pool: dict[str, Any]
    members: dict[str, dict[str, Any] | None]  # in spec order
    pods: dict[str, int]  # pods present per member, terminating ones included

    @property
    def status(self) -> dict[str, Any]:
        """The pool's status as stored."""
        return self.pool.get("status") or {}


@dataclass
class Plan:
    """What one pass does: replica patches, the status to write, whether to look again soon."""

    owner: str | None
    replicas: dict[str, int] = field(default_factory=dict)
    deferred: tuple[str, str] | None = None  # (reason, message)
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
    """Phase Ready with a ready pod: the member can serve."""
    status = (isvc or {}).get("status") or {}
    return status.get("phase") == "Ready" and int(status.get("readyReplicas") or 0) >= 1


def is_metal(isvc: dict[str, Any] | None) -> bool:
    """True for a member served by a Metal agent outside the cluster."""
    return str(((isvc or {}).get("spec") or {}).get("accelerator", "")).lower() == METAL_ACCELERATOR


def resolve_owner(view: PoolView) -> str | None:
    """The member that should own the slot (step 1 of the theory above)."""
    names = list(view.members)
    resident = view.status.get("residentMember") or None
    pending = view.status.get("pendingMember") or None
    if resident not in names:
        resident = None
    if pending in names and pending != resident:
        others = [n for n in names if n != pending and desired_replicas(view.members[n]) >= 1]
        # A target that failed to load must not wedge the pool: a new request takes over.
        if phase_of(view.members[pending]) != "Failed" or not others:
            return pending
        return others[0]
    requested = [n for n in names if n != resident and desired_replicas(view.members[n]) >= 1]
    if requested:
        return requested[0]
    if resident:
        return resident
    default = (view.pool.get("spec") or {}).get("default")
    return default if default in names else None


def needs_idle_check(view: PoolView, owner: str | None) -> list[str]:
    """Non-owners that asked for replicas and are Ready: only those are probed before unloading."""
    return [n for n, isvc in view.members.items()
            if n != owner and desired_replicas(isvc) >= 1 and is_ready(isvc)]


def plan(view: PoolView, idle: dict[str, bool | None], now: str) -> Plan:
    """Decide one pass. `idle` answers the probe per member (None: could not tell)."""
    names = list(view.members)
    missing = [n for n, isvc in view.members.items() if isvc is None]
    metal = [n for n, isvc in view.members.items() if is_metal(isvc)]
    degraded = bool(missing or metal) or not names
    owner = None if degraded else resolve_owner(view)
    result = Plan(owner)
    if owner is not None:
        _plan_replicas(view, owner, idle, result)
    resident = view.status.get("residentMember") or None
    if resident not in names:
        resident = None
    if owner is not None and is_ready(view.members[owner]) and owner not in result.replicas:
        resident = owner  # the owner serves: the swap (or the warm-up) is done
    pending = owner if owner is not None and owner != resident else None
    if degraded:
        phase = "Degraded"
    elif resident is None:
        phase = "Pending"
    elif pending is None and is_ready(view.members[resident]):
        phase = "Ready"
    else:
        phase = "Swapping"
    result.requeue = phase in ("Pending", "Swapping") and owner is not None
    result.status = _status(view, phase, resident, pending, result.deferred, missing, metal, now)
    return result


def _plan_replicas(view: PoolView, owner: str, idle: dict[str, bool | None],
                   result: Plan) -> None:
    for name, isvc in view.members.items():
        if name == owner or desired_replicas(isvc) < 1:
            continue
        if is_ready(isvc) and idle.get(name) is not True:
            # Unloading a server mid-generation would cut a client off; unknown counts as busy.
            reason = "PodsBusy" if idle.get(name) is False else "IdleCheckFailed"
            result.deferred = (reason, f"{name} still owns the slot: "
                               + ("a request is in progress" if reason == "PodsBusy"
                                  else "its idleness could not be checked"))
            continue
        result.replicas[name] = 0
    # Only this pool's members: another pool's pods in the same namespace hold another GPU.
    others_present = any(count for name, count in view.pods.items()
                         if name != owner and name in view.members)
    owner_replicas = desired_replicas(view.members[owner])
    resident = view.status.get("residentMember") or None
    if others_present:
        # A terminating pod still holds GPU memory: the owner waits for it to be gone. An owner
        # scaled up early (an activator's trigger) is held at 0; a serving resident is left be.
        if owner != resident and owner_replicas >= 1:
            result.replicas[owner] = 0
    elif owner_replicas != 1:
        result.replicas[owner] = 1


def _status(view: PoolView, phase: str, resident: str | None, pending: str | None,
            deferred: tuple[str, str] | None, missing: list[str], metal: list[str],
            now: str) -> dict[str, Any]:
    generation = (view.pool.get("metadata") or {}).get("generation")
    previous = {c.get("type"): c for c in view.status.get("conditions") or []}

    def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        status = "True" if ok else "False"
        before = previous.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == status else None
        entry = {"type": kind, "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": since or now}
        if generation is not None:
            entry["observedGeneration"] = generation
        return entry

    allocated = phase == "Ready"
    conditions = [
        condition("SlotAllocated", allocated, "Resident" if allocated else "Swapping",
                  f"{resident} owns the slot" if allocated
                  else f"waiting for {pending or 'a request'} to become ready"),
        condition("MembersValid", not missing, "MissingMembers" if missing else "AllResolved",
                  f"missing: {', '.join(missing)}" if missing else "every member exists"),
        condition("SwapDeferred", deferred is not None,
                  deferred[0] if deferred else "NotDeferred",
                  deferred[1] if deferred else "no swap is waiting on the incumbent"),
        condition("MetalSupported", not metal,
                  "MetalMembersUnsupported" if metal else "KubernetesGPU",
                  f"Metal-backed members: {', '.join(metal)}; replicas are not managed" if metal
                  else "every member runs on Kubernetes GPUs"),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        # None deletes the field in a merge patch: an empty value means "none"
        "residentMember": resident,
        "pendingMember": pending,
        "members": [_member_status(n, isvc, n == resident) for n, isvc in view.members.items()],
        "conditions": conditions,
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _member_status(name: str, isvc: dict[str, Any] | None, resident: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "resident": resident}
    if phase_of(isvc):
        entry["phase"] = phase_of(isvc)
    return entry


def differs(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """True when writing `wanted` would change `current` (None fields mean absent)."""
    return any(current.get(k) != v for k, v in wanted.items() if v is not None) or \
        any(k in current for k, v in wanted.items() if v is None)
