"""Pure readers of raw Kubernetes objects: ModelPool -> PoolSpec, pod -> member, and friends.

No I/O and no state: the watcher feeds decoded JSON in and keeps what comes out.
"""

from __future__ import annotations

import re
from typing import Any

from extproc.platform.kube import activation
from extproc.platform.kube.idle import IdleProbe, choose_probe
from extproc.policy import writers
from extproc.policy.model import PoolKey, PoolSpec, PoolStatus
from extproc.settings import Settings, parse_duration
from extproc.names import (ALIASES_ANNOTATION, CAPACITY_ANNOTATION, CARRY_ANNOTATION,
                           FAIRNESS_ANNOTATION, MAX_HELD_ANNOTATION, MIN_RESIDENCY_ANNOTATION,
                           RESUME_ANNOTATION, SERVICE_LABEL)

APP_LABEL = "app"
# The CRD's defaults (LLMKube's too), for objects stored before a default existed.
DEFAULT_SWAP_POLICY = "sticky"
DEFAULT_RECLAIM_AFTER = 300.0

# An object name (Kubernetes' DNS-1123 subdomain): a member name is an InferenceService name.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A model name a client may send: letters, digits and . _ - : / @ +, starting and ending with
# a letter or digit (HF-style "org/model" and "model:tag" included); ".." never.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:/@+-]*[A-Za-z0-9])?")
_MAX_NAME = 253

# Pods in these phases have no running container left, so they hold no device memory even
# though the object lingers (kubelet-evicted pods stay as Failed until garbage collected).
_FINISHED_POD_PHASES = ("Succeeded", "Failed")


def object_key(obj: dict[str, Any]) -> tuple[str, str]:
    """(namespace, name) of any namespaced object."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def is_object_name(name: str) -> bool:
    """Whether ``name`` is a valid Kubernetes object name (a DNS-1123 subdomain)."""
    return len(name) <= _MAX_NAME and _DNS_SUBDOMAIN.fullmatch(name) is not None


def is_plain_name(name: str) -> bool:
    """Whether ``name`` may be a model name an alias answers to."""
    return len(name) <= _MAX_NAME and ".." not in name and \
        _PLAIN_NAME.fullmatch(name) is not None


def pod_member(pod: dict[str, Any]) -> str:
    """The member a pod belongs to ("" for none): its service label, failing that ``app``.

    A finished pod belongs to no member: it no longer holds GPU memory. A terminating pod
    (deletionTimestamp set) still belongs to its member: until it is gone its process may
    still hold the model in memory, which is why a swap waits for it.
    """
    if (pod.get("status") or {}).get("phase") in _FINISHED_POD_PHASES:
        return ""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(SERVICE_LABEL) or labels.get(APP_LABEL) or ""


# The condition types this service writes; every other type belongs to someone else.
OWN_CONDITIONS = frozenset({"SlotAllocated", "MembersValid", "SwapDeferred", "SpecValid",
                            "SwapStalled", "Actuating"})


# Condition types only LLMKube's ModelPoolReconciler writes: where they are, it manages the pool.
LLMKUBE_CONDITIONS = frozenset({"MetalSupported"})


def llmkube_manages(status: dict[str, Any]) -> bool:
    """Whether ``status`` carries a condition only LLMKube's reconciler writes."""
    return any(isinstance(c, dict) and c.get("type") in LLMKUBE_CONDITIONS
               for c in status.get("conditions") or [])


def pool_status(status: dict[str, Any], foreign: bool, written_by: str = "") -> PoolStatus:
    """What routing needs of a ModelPool's ``.status``; ``written_by``: who set its slot
    fields last (``field_owner``), named only when the change is foreign."""
    deferred = next((c for c in status.get("conditions") or [] if isinstance(c, dict)
                     and c.get("type") == "SwapDeferred" and c.get("status") == "True"), {})
    return PoolStatus(resident=str(status.get("residentMember") or ""),
                      pending=str(status.get("pendingMember") or ""),
                      deferred_reason=str(deferred.get("reason") or ""),
                      deferred_message=str(deferred.get("message") or ""), foreign=foreign,
                      llmkube=llmkube_manages(status),
                      written_by=written_by if foreign and writers.foreign(written_by) else "")


def field_owner(obj: dict[str, Any], *paths: tuple[str, ...]) -> str:
    """The field manager that last set any of ``paths`` (e.g. ``("spec", "replicas")``) of
    ``obj``, from its ``metadata.managedFields`` ("" when none is recorded).

    An Update takes a field from every other manager; an Apply of the same value shares it.
    Among several owners the latest write (``time``, then list order) is the one named: the
    other writer a swap met is the one that wrote last, not the one that created the object.
    """
    owners: list[tuple[str, int, str]] = []
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(entry, dict) or entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        if any(_owns(entry.get("fieldsV1"), path) for path in paths):
            owners.append((str(entry.get("time") or ""), index, str(entry.get("manager") or "")))
    return max(owners)[2] if owners else ""


def _owns(fields: Any, path: tuple[str, ...]) -> bool:
    """Whether a FieldsV1 set holds ``path`` (or something under it)."""
    for part in path:
        if not isinstance(fields, dict) or f"f:{part}" not in fields:
            return False
        fields = fields[f"f:{part}"]
    return True


REPLICAS_FIELD = ("spec", "replicas")
# the status fields that say who owns the slot: whoever writes them, actuates the pool
SLOT_FIELDS = (("status", "phase"), ("status", "residentMember"), ("status", "pendingMember"))


def service_state(isvc: dict[str, Any]) -> tuple[str, int]:
    """(status.phase, spec.replicas) of an InferenceService; replicas default to 1 (LLMKube)."""
    replicas = (isvc.get("spec") or {}).get("replicas")
    phase = (isvc.get("status") or {}).get("phase") or ""
    return phase, 1 if replicas is None else int(replicas)


def service_capacity(isvc: dict[str, Any]) -> tuple[int, str]:
    """(capacity, problem) from the paced-release annotation: 0 when absent or invalid."""
    raw = ((isvc.get("metadata") or {}).get("annotations") or {}).get(CAPACITY_ANNOTATION)
    if raw is None or not str(raw).strip():
        return 0, ""
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        return 0, f"{CAPACITY_ANNOTATION} {raw!r} is not a count (1 or more); ignored"
    return value, ""


def service_carry(isvc: dict[str, Any]) -> str:
    """The model whose prompt cache the member carries over swaps ("" : it carries none):
    its ``spec.modelRef``, else its own name, when the carry annotation says "true"."""
    meta = isvc.get("metadata") or {}
    if str((meta.get("annotations") or {}).get(CARRY_ANNOTATION, "")).strip().lower() != "true":
        return ""
    model = (isvc.get("spec") or {}).get("modelRef")
    if isinstance(model, dict):  # (a reference object in some LLMKube versions)
        model = model.get("name")
    return str(model or meta.get("name") or "member")


def service_probe(isvc: dict[str, Any]) -> IdleProbe | None:
    """The idle probe for an InferenceService, from its annotations and ``spec.runtime``."""
    annotations = (isvc.get("metadata") or {}).get("annotations") or {}
    runtime = (isvc.get("spec") or {}).get("runtime") or ""
    return choose_probe(annotations, runtime if isinstance(runtime, str) else "")


def pool_spec(pool: dict[str, Any], settings: Settings) -> tuple[PoolSpec, tuple[str, ...]]:
    """Build the PoolSpec of a ModelPool object, plus a list of problems found in it.

    Invalid parts fall back to defaults rather than rejecting the pool, so one typo does not
    take a serving pool offline; the problems are reported in the pool's status instead.
    """
    meta = pool.get("metadata") or {}
    spec = pool.get("spec") or {}
    annotations = meta.get("annotations") or {}
    problems: list[str] = []

    members: list[str] = []
    for entry in spec.get("members") or []:
        name = ((entry or {}).get("inferenceServiceRef") or {}).get("name") or ""
        if not name:
            problems.append("a member has an empty inferenceServiceRef.name; ignored")
        elif not is_object_name(name):
            problems.append(f"member {name!r} is not a valid object name (DNS-1123 subdomain: "
                            "lower-case letters, digits, '-' and '.'); ignored")
        elif name in members:
            problems.append(f"member {name} is listed twice; the repeat is ignored")
        else:
            members.append(name)

    default = spec.get("default") or ""
    if default and default not in members:
        problems.append(f"spec.default {default} is not a member; ignored")
        default = ""

    swap_budget = _duration(spec.get("swapBudget"), settings.swap_budget, "spec.swapBudget",
                            problems, allow_zero=False)
    fairness = _duration(annotations.get(FAIRNESS_ANNOTATION), settings.fairness_window,
                         f"annotation {FAIRNESS_ANNOTATION}", problems, allow_zero=True)
    aliases = _aliases(annotations.get(ALIASES_ANNOTATION) or "", members, problems)
    swap_policy = _swap_policy(spec.get("swapPolicy"), problems)
    reclaim_after = _duration(spec.get("reclaimAfter"), DEFAULT_RECLAIM_AFTER,
                              "spec.reclaimAfter", problems, allow_zero=False)
    swap_delay = _duration(spec.get("swapDelay"), 0.0, "spec.swapDelay", problems,
                           allow_zero=True)
    scheduler = spec.get("schedulerName")
    if scheduler is not None and not isinstance(scheduler, str):
        problems.append(f"spec.schedulerName {scheduler!r} is not a name; ignored")
        scheduler = ""

    max_held = _count(annotations.get(MAX_HELD_ANNOTATION),
                      f"annotation {MAX_HELD_ANNOTATION}", problems)

    key = PoolKey(meta.get("namespace", ""), meta.get("name", ""))
    fallbacks = {m: activation.fallback_value(service, key.namespace) for m, (service, _)
                 in activation.fallback_backends(annotations, members, problems).items()}
    return PoolSpec(key=key, members=tuple(members), default=default, swap_budget=swap_budget,
                    fairness_window=fairness, generation=int(meta.get("generation") or 0),
                    aliases=aliases, swap_policy=swap_policy,
                    reclaim_after=reclaim_after, swap_delay=swap_delay,
                    scheduler_name=scheduler or "", max_held=max_held,
                    resume=str(annotations.get(RESUME_ANNOTATION) or ""),
                    activation=activation.activation(annotations, problems),
                    priorities=activation.priorities(annotations, problems),
                    min_residency=_count(annotations.get(MIN_RESIDENCY_ANNOTATION),
                                         f"annotation {MIN_RESIDENCY_ANNOTATION}", problems,
                                         "0 (off)") or 0,
                    fallbacks=fallbacks), tuple(problems)


def _swap_policy(raw: Any, problems: list[str]) -> str:
    """spec.swapPolicy as written; only a value that is not a name at all becomes sticky.

    An unknown name ("priority" on an LLMKube branch, whatever comes next) is kept as is: the
    policy reports it as unsupported and runs the pool as sticky, instead of this reader
    guessing, so the value the user wrote stays visible.
    """
    if raw is None or raw == "":
        return DEFAULT_SWAP_POLICY
    if not isinstance(raw, str):
        problems.append(f"spec.swapPolicy {raw!r} is not a string; using {DEFAULT_SWAP_POLICY}")
        return DEFAULT_SWAP_POLICY
    return raw


def _count(raw: Any, what: str, problems: list[str],
           fallback: str = "the process default (--max-held)") -> int | None:
    """An optional non-negative integer (0 = no bound); None when absent or invalid."""
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        problems.append(f"{what} {raw!r} is not a count (0 or more); using {fallback}")
        return None
    return value


def _duration(raw: Any, fallback: float, what: str, problems: list[str], *,
              allow_zero: bool) -> float:
    """Parse an optional duration; on a bad value note it in ``problems`` and use ``fallback``."""
    if raw is None or raw == "":
        return fallback
    try:
        value = parse_duration(raw)
    except (ValueError, TypeError):
        value = -1.0
    if value < 0 or (value == 0 and not allow_zero):
        problems.append(f"{what} {raw!r} is not a valid duration; using {fallback:g}s")
        return fallback
    return value


def _aliases(text: str, members: list[str], problems: list[str]) -> dict[str, str]:
    """Parse ``alias=member,alias2=member2``, dropping entries that name no member."""
    aliases: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        alias, sep, member = (part.strip() for part in item.partition("="))
        if not sep or not alias or not member:
            problems.append(f"alias entry {item.strip()!r} is not alias=member; ignored")
        elif not is_plain_name(alias):
            problems.append(f"alias {alias!r} is not a plain model name (letters, digits and "
                            "._-:/@+, no '..'); ignored")
        elif member not in members:
            problems.append(f"alias {alias} names {member}, which is not a member; ignored")
        else:
            aliases[alias] = member
    return aliases
