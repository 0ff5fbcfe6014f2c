"""What the member simulator reads of an InferenceService: replicas, its controls, a change."""

from __future__ import annotations

from typing import Any

from devstack.simulator_kube import KILL_SEEN

ANN_LOAD_DELAY = "sim.llmkube.dev/load-delay"
ANN_UNLOAD_DELAY = "sim.llmkube.dev/unload-delay"
ANN_FAIL = "sim.llmkube.dev/fail"
ANN_KILL = "sim.llmkube.dev/kill-pod"
ANN_STUCK = "sim.llmkube.dev/stuck"


def annotations(isvc: dict[str, Any] | None) -> dict[str, str]:
    """The InferenceService's annotations ({} for none)."""
    return ((isvc or {}).get("metadata") or {}).get("annotations") or {}


def uid(isvc: dict[str, Any] | None) -> str | None:
    """metadata.uid: tells a re-created InferenceService from the one before."""
    return ((isvc or {}).get("metadata") or {}).get("uid")


def flag(isvc: dict[str, Any] | None, key: str) -> bool:
    """True when the annotation `key` says "true"."""
    return annotations(isvc).get(key, "").strip().lower() == "true"


def desired_replicas(isvc: dict[str, Any] | None) -> int:
    """spec.replicas; absent means 1, the Deployment default LLMKube inherits."""
    if isvc is None:
        return 0
    replicas = (isvc.get("spec") or {}).get("replicas")
    return 1 if replicas is None else int(replicas)


def kill_requested(isvc: dict[str, Any] | None, pod: dict[str, Any]) -> bool:
    """True when the kill-pod annotation changed since the pod was created."""
    seen = (pod["metadata"].get("annotations") or {}).get(KILL_SEEN, "")
    return annotations(isvc).get(ANN_KILL, "") != seen


def needs_pass(before: dict[str, Any] | None, after: dict[str, Any] | None) -> bool:
    """False when only the status (or bookkeeping metadata) changed: the simulator acts on
    spec, annotations and deletion alone, and most such changes are the echoes of its own
    status writes, whose passes would only re-list pods while the next swap waits."""
    if before is None or after is None:
        return True
    meta_before, meta_after = before.get("metadata") or {}, after.get("metadata") or {}
    return (before.get("spec") != after.get("spec")
            or any(meta_before.get(k) != meta_after.get(k)
                   for k in ("uid", "annotations", "deletionTimestamp")))
