"""Sample ModelPools for the CRD tests: the seed corpus, and the newer API's (reclaim).

The seed corpus (``VALID``, ``INVALID``) is judged the same by our CRD and by LLMKube's CRD as
kept in ../shared. The newer corpus uses what later LLMKube releases added; the shared CRD
predates them, so ``newer_llmkube_schema`` applies exactly that delta to the shared file and
the tests compare our verdicts with the result.
"""

from __future__ import annotations

import copy
from typing import Any

def pool(**spec: Any) -> dict[str, Any]:
    """A ModelPool with two members and ``spec`` merged in."""
    base = {"members": [{"inferenceServiceRef": {"name": "judge"}},
                        {"inferenceServiceRef": {"name": "coder"}}]}
    base.update(spec)
    return {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelPool",
            "metadata": {"name": "shared-gpu", "namespace": "llm"}, "spec": base}


def with_status(status: dict[str, Any]) -> dict[str, Any]:
    """A minimal ModelPool carrying ``status``."""
    obj = pool()
    obj["status"] = status
    return obj


_COND = {"type": "SlotAllocated", "status": "True", "reason": "MemberResident", "message": "",
         "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 3}


def cond(**changes: Any) -> dict[str, Any]:
    """A pool whose one condition is ``_COND`` with ``changes`` (None drops a key)."""
    cond = dict(_COND, **changes)
    return with_status({"conditions": [{k: v for k, v in cond.items() if v is not None}]})


VALID = {
    "minimal": pool(),
    "one member": pool(members=[{"inferenceServiceRef": {"name": "judge"}}]),
    "full spec": pool(default="judge", gpu=2, swapPolicy="sticky", swapBudget="90s",
                       nodeSelector={"kubernetes.io/hostname": "gpu-1"}),
    "gpu zero": pool(gpu=0),
    "empty ref name": pool(members=[{"inferenceServiceRef": {}}]),
    "full status": with_status({
        "phase": "Ready", "residentMember": "judge", "pendingMember": "", "observedGeneration": 4,
        "members": [{"name": "judge", "phase": "Ready", "resident": True},
                    {"name": "coder", "phase": "Stopped", "resident": False}],
        "conditions": [_COND, dict(_COND, type="SwapDeferred", status="False",
                                   reason="PodsBusy", message="incumbent busy")]}),
    "condition domain type": cond(type="inference.llmkube.dev/MembersValid"),
    "condition unknown": cond(status="Unknown"),
    "condition fractional time": cond(lastTransitionTime="2025-01-01T00:00:00.123+02:00"),
    "swapping": with_status({"phase": "Swapping", "residentMember": "judge",
                              "pendingMember": "coder"}),
}

INVALID = {
    "no spec": {k: v for k, v in pool().items() if k != "spec"},
    "missing members": pool(members=None) | {"spec": {"default": "judge"}},
    "empty members": pool(members=[]),
    "member without ref": pool(members=[{"name": "judge"}]),
    "members not a list": pool(members={"inferenceServiceRef": {"name": "judge"}}),
    "bad swapPolicy": pool(swapPolicy="priority"),
    "negative gpu": pool(gpu=-1),
    "gpu as string": pool(gpu="1"),
    "swapBudget as number": pool(swapBudget=300),
    "nodeSelector non-string": pool(nodeSelector={"gpu": 1}),
    "ref name not string": pool(members=[{"inferenceServiceRef": {"name": 7}}]),
    "bad phase": with_status({"phase": "Running"}),
    "bad condition status": cond(status="Yes"),
    "condition missing reason": cond(reason=None),
    "condition empty reason": cond(reason=""),
    "condition bad reason": cond(reason="not valid!"),
    "condition missing message": cond(message=None),
    "condition bad time": cond(lastTransitionTime="yesterday"),
    "condition negative generation": cond(observedGeneration=-1),
    "condition long message": cond(message="x" * 32769),
    "condition bad type": cond(type="-Bad"),
    "status member without name": with_status({"members": [{"phase": "Ready"}]}),
    "status resident not bool": with_status({"members": [{"name": "judge",
                                                           "resident": "yes"}]}),
}


# A time in every offset form the API server accepts for a metav1.Time field.
_IDLE_SINCE = "2026-03-01T12:00:00Z"

NEWER_VALID = {
    "reclaim with default": pool(swapPolicy="reclaim", default="judge"),
    "reclaim with reclaimAfter": pool(swapPolicy="reclaim", default="judge",
                                      reclaimAfter="10m"),
    "reclaimAfter compound": pool(swapPolicy="reclaim", default="judge",
                                  reclaimAfter="1h30m"),
    "reclaimAfter under sticky": pool(reclaimAfter="45s"),
    "reclaim without default": pool(swapPolicy="reclaim"),
    "swapDelay": pool(swapDelay="30s"),
    "reclaim-down": pool(swapPolicy="reclaim-down", reclaimAfter="10m"),
    "swapDelay zero": pool(swapDelay="0s"),
    "schedulerName": pool(schedulerName="gpu-binpack"),
    "residentIdleSince": with_status({"phase": "Ready", "residentMember": "coder",
                                      "residentIdleSince": _IDLE_SINCE}),
    "residentIdleSince with offset": with_status({
        "residentIdleSince": "2026-03-01T14:00:00.250+02:00"}),
}

NEWER_INVALID = {
    "reclaimAfter as number": pool(reclaimAfter=300),
    "reclaimAfter as object": pool(reclaimAfter={"seconds": 300}),
    "swapPolicy case": pool(swapPolicy="Reclaim"),
    "swapPolicy priority (a branch only)": pool(swapPolicy="priority", minResidency="5m"),
    "residentIdleSince not a time": with_status({"residentIdleSince": "yesterday"}),
    "residentIdleSince as number": with_status({"residentIdleSince": 1767225600}),
    "residentIdleSince date only": with_status({"residentIdleSince": "2026-03-01"}),
    "swapDelay as number": pool(swapDelay=30),
    "schedulerName as object": pool(schedulerName={"name": "gpu-binpack"}),
}


def newer_llmkube_schema(seed: dict[str, Any]) -> dict[str, Any]:
    """LLMKube's ModelPool schema ``seed`` plus what its newer releases added.

    From LLMKube's api/v1alpha1 ModelPool types (facts, read with the search tool): the swap
    policy enum is ``sticky;reclaim``; ``spec.reclaimAfter`` is a ``*metav1.Duration`` (a string
    in OpenAPI) defaulted to "300s"; ``status.residentIdleSince`` is a ``*metav1.Time`` (a
    date-time string). Nothing else changed in the schema up to 0.9.28.

    Release 0.11.0 added ``spec.swapDelay``, ``spec.schedulerName`` and the swap policy
    ``reclaim-down``; only its release lines are readable, so their types here are our
    reading: a ``*metav1.Duration`` (a string, no default), a scheduler's name (a string), and
    one more enum value.
    """
    schema = copy.deepcopy(seed)
    spec = schema["properties"]["spec"]["properties"]
    spec["swapPolicy"]["enum"] = ["sticky", "reclaim"]
    spec["reclaimAfter"] = {"type": "string", "default": "300s"}
    spec["swapPolicy"]["enum"] = ["sticky", "reclaim", "reclaim-down"]
    spec["swapDelay"] = {"type": "string"}
    spec["schedulerName"] = {"type": "string", "maxLength": 253}
    status = schema["properties"]["status"]["properties"]
    status["residentIdleSince"] = {"type": "string", "format": "date-time"}
    return schema
