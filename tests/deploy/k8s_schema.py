"""Validate objects against a CRD's openAPIV3Schema with jsonschema, the way the API server would.

Kubernetes' structural schemas are OpenAPI v3 plus ``x-kubernetes-*`` extensions. Two of the
extensions change what is valid (``x-kubernetes-int-or-string``, ``nullable``); the rest only
affect pruning, merging or storage and are dropped. Defaults are applied before validation,
as the API server does on create.
"""

from __future__ import annotations

import copy
import datetime
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from devstack import upstream_crds
from devstack.kubeapi.resources import apply_defaults as fill_defaults

PROJECT_ROOT = Path(__file__).resolve().parents[2]
OUR_CRDS = PROJECT_ROOT / "crds"
#: LLMKube's own CRDs (its repository's config/crd/bases, defilantech/LLMKube), published in no
#: Go module: the project's workspace keeps a copy beside the clone, in ../shared/reference/crds.
#: The tests that need them skip without, saying so (LLMKUBE_MISSING).
LLMKUBE = PROJECT_ROOT.parent / "shared" / "reference" / "crds" / "llmkube"
LLMKUBE_MISSING = ("LLMKube's own CRD (config/crd/bases of LLMKube's repository) is published in no "
                   "Go module; these tests read it from the reference folder beside the clone, "
                   "../shared/reference/crds/llmkube, which is not here")
#: The Prometheus Operator kinds our manifests use (the operator's other CRDs are not loaded).
OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")

FORMATS = jsonschema.FormatChecker()
#: Kubernetes release whose built-in schemas (from kubernetes-validate) manifests must meet.
KUBE_VERSION = "1.32"
#: API groups Kubernetes itself serves: checked against its built-in schemas, not a CRD.
BUILTIN_GROUPS = {"", "apps", "policy", "rbac.authorization.k8s.io", "networking.k8s.io",
                  "apiextensions.k8s.io", "flowcontrol.apiserver.k8s.io"}


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    # RFC 3339 needs a full date, a time and an offset
    if "T" not in value.upper() or not (value.endswith(("Z", "z")) or value[-6] in "+-"):
        raise ValueError(f"not an RFC 3339 date-time: {value!r}")
    datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return True


@FORMATS.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@FORMATS.checks("int64")
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def to_jsonschema(node: Any, strict: bool = False) -> Any:
    """Convert a Kubernetes structural schema node into plain JSON Schema.

    ``strict`` rejects unknown fields, as ``kubectl apply`` (server-side field validation
    Strict) does; without it they pass, as the API server prunes them silently.
    """
    if isinstance(node, list):
        return [to_jsonschema(item, strict) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "default"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: to_jsonschema(sub, strict) for name, sub in value.items()}
        else:
            out[key] = to_jsonschema(value, strict)
    if (strict and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **out}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Return a copy of ``obj`` with the schema's defaults filled in (API-server style)."""
    obj = copy.deepcopy(obj)
    fill_defaults(schema, obj)
    return obj


def load_crds(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Map (group, version, kind) to the openAPIV3Schema of every CRD in a file or folder."""
    files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
    schemas: dict[tuple[str, str, str], dict[str, Any]] = {}
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                key = (spec["group"], version["name"], spec["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def upstream_crd_files() -> list[Path]:
    """Gateway API's, Envoy Gateway's, InferencePool's and the operator kinds' CRD files from
    the Go module cache (`make schemas`); a skip saying why when not recorded, a failure under
    CI=true."""
    return (upstream_crds.need(upstream_crds.files, "gateway-api")
            + upstream_crds.need(upstream_crds.files, "envoy-gateway")
            + upstream_crds.need(upstream_crds.files, "inference-extension", ("InferencePool",))
            + upstream_crds.need(upstream_crds.files, "prometheus-operator", OPERATOR_KINDS))


@functools.cache
def _upstream_schemas() -> dict[tuple[str, str, str], dict[str, Any]]:
    schemas: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in upstream_crd_files():
        schemas |= load_crds(path)
    return schemas


def upstream_schemas() -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) -> schema of every upstream CRD file above (parsed once, shared:
    do not modify)."""
    return _upstream_schemas()


def llmkube_crd(name: str) -> Path:
    """LLMKube's CRD file `name` (see LLMKUBE); a skip saying where it comes from when absent."""
    path = LLMKUBE / name
    if not path.exists():
        pytest.skip(f"{path} is missing: {LLMKUBE_MISSING}")
    return path


def errors(schema: dict[str, Any], obj: dict[str, Any], strict: bool = False) -> list[str]:
    """Validation errors of ``obj`` (after defaulting) under ``schema``; empty when valid."""
    validator = jsonschema.Draft4Validator(to_jsonschema(schema, strict), format_checker=FORMATS)
    found = validator.iter_errors(apply_defaults(schema, obj))
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found)


def builtin_errors(obj: dict[str, Any]) -> list[str]:
    """Errors of a built-in kind under Kubernetes' own schema, unknown fields included."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path)) or '<root>'}: {exc.message}"]
    return []
