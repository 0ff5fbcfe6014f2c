"""Autoscalers aimed at member InferenceServices: HorizontalPodAutoscalers (autoscaling/v2)
and KEDA ScaledObjects (keda.sh/v1alpha1, where that CRD is installed).

The watcher lists and watches both kinds (RBAC: list and watch only) and keeps this index of
which autoscaler targets which (namespace, InferenceService); each member's observation
carries the first one by name (``MemberObservation.autoscaled_by``), and the policy refuses
the member (``policy/autoscaled.py``). A cluster without KEDA answers 404 for ScaledObjects:
that collection is empty, and asked again every ``ABSENT_RETRY`` seconds in case KEDA is
installed later.
"""

from __future__ import annotations

from typing import Any

from extproc.platform.kube._calls import segment

HPAS = "horizontalpodautoscalers"
SCALED_OBJECTS = "scaledobjects"
KINDS = {HPAS: "HorizontalPodAutoscaler", SCALED_OBJECTS: "ScaledObject"}
PATHS = {HPAS: "/apis/autoscaling/v2", SCALED_OBJECTS: "/apis/keda.sh/v1alpha1"}
OPTIONAL = frozenset({SCALED_OBJECTS})  # a CRD that may not be installed
ABSENT_RETRY = 300.0
MEMBER_GROUP = "inference.llmkube.dev"
MEMBER_KIND = "InferenceService"


def collection_path(kind: str, scope: str) -> str:
    """The list/watch URL of ``kind`` in ``scope`` ("" = every namespace)."""
    base = PATHS[kind]
    return f"{base}/namespaces/{segment(scope)}/{kind}" if scope else f"{base}/{kind}"


def target(obj: dict[str, Any]) -> str:
    """The InferenceService an autoscaler object scales ("" : something else)."""
    ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
    if not isinstance(ref, dict) or ref.get("kind") != MEMBER_KIND:
        return ""
    group = str(ref.get("apiVersion") or "").partition("/")[0]
    return str(ref.get("name") or "") if group == MEMBER_GROUP else ""


class Autoscalers:
    """Which autoscaler targets which member: (namespace, "Kind/name") -> member."""

    def __init__(self) -> None:
        self._targets: dict[tuple[str, str], str] = {}

    def apply(self, kind: str, namespace: str, name: str, obj: dict | None) -> set[str]:
        """Store or drop one autoscaler; the members whose autoscaler may have changed."""
        key = (namespace, f"{KINDS[kind]}/{name}")
        before = self._targets.pop(key, "")
        after = target(obj) if obj is not None else ""
        if after:
            self._targets[key] = after
        return {m for m in (before, after) if m}

    def keys(self, kind: str, scope: str) -> list[tuple[str, str]]:
        """(namespace, name) of the stored autoscalers of ``kind`` in ``scope``."""
        prefix = f"{KINDS[kind]}/"
        return [(ns, label.removeprefix(prefix)) for ns, label in self._targets
                if label.startswith(prefix) and (not scope or ns == scope)]

    def of(self, namespace: str, member: str) -> str:
        """The autoscaler aimed at ``member`` ("Kind/name", the first by name; "" : none)."""
        found = sorted(label for (ns, label), m in self._targets.items()
                       if ns == namespace and m == member)
        return found[0] if found else ""
