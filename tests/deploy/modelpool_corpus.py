"""The ModelPool sample corpus: objects every correct CRD accepts (VALID) or rejects (INVALID).

Shared by the jsonschema checks (tests/deploy/test_crds.py) and the real API server's
(tests/kube_real/test_real_crds.py).
"""

from __future__ import annotations

from typing import Any


def pool(**spec: Any) -> dict[str, Any]:
    """A ModelPool llm/shared-gpu with members judge and coder, ``spec`` merged over them."""
    base = {"members": [{"inferenceServiceRef": {"name": "judge"}},
                        {"inferenceServiceRef": {"name": "coder"}}]}
    base.update(spec)
    return {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelPool",
            "metadata": {"name": "shared-gpu", "namespace": "llm"}, "spec": base}


def with_status(status: dict[str, Any]) -> dict[str, Any]:
    """The minimal pool carrying ``status``."""
    obj = pool()
    obj["status"] = status
    return obj


_COND = {"type": "SlotAllocated", "status": "True", "reason": "MemberResident", "message": "",
         "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 3}


def _cond(**changes: Any) -> dict[str, Any]:
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
    "condition domain type": _cond(type="inference.llmkube.dev/MembersValid"),
    "condition unknown": _cond(status="Unknown"),
    "condition fractional time": _cond(lastTransitionTime="2025-01-01T00:00:00.123+02:00"),
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
    "bad condition status": _cond(status="Yes"),
    "condition missing reason": _cond(reason=None),
    "condition empty reason": _cond(reason=""),
    "condition bad reason": _cond(reason="not valid!"),
    "condition missing message": _cond(message=None),
    "condition bad time": _cond(lastTransitionTime="yesterday"),
    "condition negative generation": _cond(observedGeneration=-1),
    "condition long message": _cond(message="x" * 32769),
    "condition bad type": _cond(type="-Bad"),
    "status member without name": with_status({"members": [{"phase": "Ready"}]}),
    "status resident not bool": with_status({"members": [{"name": "judge",
                                                           "resident": "yes"}]}),
}
