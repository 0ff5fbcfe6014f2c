"""The objects a local stack starts with: the demo sample, or pools built in code for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
API_VERSION = "inference.llmkube.dev/v1alpha1"
FAIRNESS_ANNOTATION = "modelpool.inference.llmkube.dev/fairness-window"


def load_sample(directory: Path | str = SAMPLE_DIR) -> list[dict[str, Any]]:
    """Every document of the sample manifests (namespace, members, pool), in file order."""
    docs: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    return docs


def _meta(name: str, namespace: str, annotations: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def member(name: str, namespace: str = "", annotations: dict[str, str] | None = None,
           model: str | None = None, *, replicas: int | None = 0,
           phase: str = "") -> dict[str, Any]:
    """An InferenceService (scaled to zero, as a pool member starts, unless told otherwise).

    ``replicas=None`` leaves the field out (LLMKube then defaults it to 1); ``phase`` adds a
    status, as a controller would have written it.
    """
    obj: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "InferenceService",
                           "metadata": _meta(name, namespace, annotations),
                           "spec": {"modelRef": model or f"{name}-model"}}
    if replicas is not None:
        obj["spec"]["replicas"] = replicas
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def pool(name: str, namespace: str, members: Iterable[str], *, default: str = "",
         swap_budget: str = "", fairness_window: str = "",
         annotations: dict[str, str] | None = None, **spec_fields: Any) -> dict[str, Any]:
    """A ModelPool over existing members; empty strings leave a field at its default.

    ``spec_fields`` are raw spec fields (camelCase), written last: tests use them for values
    the typed arguments would refuse.
    """
    annotations = dict(annotations or {})
    if fairness_window:
        annotations[FAIRNESS_ANNOTATION] = fairness_window
    spec: dict[str, Any] = {"swapPolicy": "sticky", "gpu": 1,
                            "members": [{"inferenceServiceRef": {"name": m}} for m in members]}
    if default:
        spec["default"] = default
    if swap_budget:
        spec["swapBudget"] = swap_budget
    spec.update(spec_fields)
    return {"apiVersion": API_VERSION, "kind": "ModelPool",
            "metadata": _meta(name, namespace, annotations), "spec": spec}


def pool_with_members(name: str, namespace: str, members: Iterable[str], *,
                      member_annotations: dict[str, dict[str, str]] | None = None,
                      **pool_fields: str) -> list[dict[str, Any]]:
    """A pool and its members (each scaled to zero), ready to apply."""
    names = list(members)
    annotations = member_annotations or {}
    return [member(m, namespace, annotations.get(m)) for m in names] + \
        [pool(name, namespace, names, **pool_fields)]


def namespaces_of(docs: Iterable[dict[str, Any]]) -> list[str]:
    """Namespaces the objects live in or declare, first-seen order."""
    found: list[str] = []
    for doc in docs:
        meta = doc.get("metadata") or {}
        ns = meta.get("name") if doc.get("kind") == "Namespace" else meta.get("namespace")
        if ns and ns not in found:
            found.append(ns)
    return found


def members_of(docs: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(namespace, name) of every InferenceService among the objects."""
    return [((d.get("metadata") or {}).get("namespace", "default"), d["metadata"]["name"])
            for d in docs if d.get("kind") == "InferenceService"]


def pools_of(docs: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(namespace, name) of every ModelPool among the objects."""
    return [((d.get("metadata") or {}).get("namespace", "default"), d["metadata"]["name"])
            for d in docs if d.get("kind") == "ModelPool"]


def dump(docs: Iterable[dict[str, Any]]) -> str:
    """A multi-document YAML stream."""
    return yaml.safe_dump_all(list(docs), sort_keys=False)
