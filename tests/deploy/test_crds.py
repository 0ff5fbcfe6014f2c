"""Our CRDs: ModelPool matches the API reference and LLMKube's own CRD; InferenceService is a
compatible minimal subset."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from k8s_schema import LLMKUBE, LLMKUBE_MISSING, OUR_CRDS, PROJECT_ROOT, apply_defaults, errors
from modelpool_samples import INVALID, VALID, pool

MODELPOOL_CRD = OUR_CRDS / "inference.llmkube.dev_modelpools.yaml"
ISVC_CRD = OUR_CRDS / "inference.llmkube.dev_inferenceservices.yaml"
LLMKUBE_MODELPOOL = LLMKUBE / "inference.llmkube.dev_modelpools.yaml"
LLMKUBE_ISVC = LLMKUBE / "inference.llmkube.dev_inferenceservices.yaml"
# LLMKube's API reference text for the ModelPool kind, kept beside LLMKube's CRDs (k8s_schema.LLMKUBE)
REFERENCE_TEXT = PROJECT_ROOT.parent / "shared" / "reference" / "modelpool-crd-reference.txt"


def _crd(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _schema(path: Path) -> dict[str, Any]:
    return _crd(path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is missing: {LLMKUBE_MISSING}")
    return path


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_samples_accepted_by_both(name: str) -> None:
    oracle = _schema(_need(LLMKUBE_MODELPOOL))
    ours = _schema(MODELPOOL_CRD)
    obj = VALID[name]
    assert errors(ours, obj) == []
    assert errors(oracle, obj) == []


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_samples_rejected_by_both(name: str) -> None:
    oracle = _schema(_need(LLMKUBE_MODELPOOL))
    ours = _schema(MODELPOOL_CRD)
    obj = INVALID[name]
    assert errors(oracle, obj), "the oracle accepts it: the sample is not a real negative"
    assert errors(ours, obj), f"our CRD accepts {name!r}"


def test_stated_defaults_agree_with_llmkube() -> None:
    oracle = _schema(_need(LLMKUBE_MODELPOOL))
    ours = apply_defaults(_schema(MODELPOOL_CRD), pool())["spec"]
    theirs = apply_defaults(oracle, pool())["spec"]
    assert ours["swapPolicy"] == theirs["swapPolicy"] == "sticky"
    assert ours["swapBudget"] == theirs["swapBudget"] == "300s"
    # the reference text states no default for gpu (LLMKube's CRD defaults it to 1): informational
    assert "gpu" not in ours


def test_names_scope_columns_subresources() -> None:
    crd = _crd(MODELPOOL_CRD)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "modelpools.inference.llmkube.dev"
    assert spec["group"] == "inference.llmkube.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {"kind": "ModelPool", "listKind": "ModelPoolList",
                             "plural": "modelpools", "singular": "modelpool",
                             "shortNames": ["mpool"]}
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"], c["type"]) for c in version["additionalPrinterColumns"]]
    assert columns == [("Policy", ".spec.swapPolicy", "string"),
                       ("Resident", ".status.residentMember", "string"),
                       ("Phase", ".status.phase", "string"),
                       ("Age", ".metadata.creationTimestamp", "date")]


def test_columns_and_names_match_llmkube() -> None:
    theirs = _crd(_need(LLMKUBE_MODELPOOL))["spec"]
    ours = _crd(MODELPOOL_CRD)["spec"]
    assert ours["names"] == theirs["names"]
    key = lambda c: (c["name"], c["jsonPath"], c["type"])  # noqa: E731
    assert [key(c) for c in ours["versions"][0]["additionalPrinterColumns"]] == \
        [key(c) for c in theirs["versions"][0]["additionalPrinterColumns"]]


# --- the API reference text ---------------------------------------------------------------------

TYPES = r"(string|integer|object|boolean|\[\]object)"
CONSTRAINTS = ("format", "minimum", "minItems", "enum", "maxLength", "minLength", "pattern")
_KEY_LINE = re.compile(r"^(.*?)(" + "|".join(CONSTRAINTS) + r"):$")
_GLUED_HEADER = re.compile(r"^(.*?)([a-z][A-Za-z]*) " + TYPES + r"( required)?$")
_TYPE_LINE = re.compile(r"^" + TYPES + r"( required)?$")


def parse_reference(text: str) -> list[dict[str, Any]]:
    """Fields of the flattened reference page: name, type, required, description, constraints.

    The page lost its layout: a constraint's value is glued to the next key or field name
    (``int32minimum:``, ``0members []object required``, ``stickystatus object``).
    """
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("No matches.")]
    start = lines.index("apiVersion", 5)  # skip the title and the example header
    fields: list[dict[str, Any]] = []
    pending_key: str | None = None

    def new(name: str, kind: str, required: str | None) -> None:
        fields.append({"name": name, "type": kind, "required": bool(required),
                       "description": [], "constraints": {}})

    def constrain(value: str) -> None:
        nonlocal pending_key
        if pending_key and fields:
            fields[-1]["constraints"][pending_key] = value
        pending_key = None

    i = start
    while i < len(lines):
        line, nxt = lines[i], lines[i + 1] if i + 1 < len(lines) else ""
        if pending_key is None and re.fullmatch(r"[a-zA-Z]+", line) and _TYPE_LINE.match(nxt):
            m = _TYPE_LINE.match(nxt)
            new(line, m.group(1), m.group(2))
            i += 2
            continue
        if pending_key is not None:
            key = _KEY_LINE.match(line)
            header = _GLUED_HEADER.match(line)
            if key:
                constrain(key.group(1))
                pending_key = key.group(2)
            elif header:
                value, name = header.group(1), header.group(2)
                # "stickystatus": the description's first word tells where the field name starts
                first = nxt.split(" ", 1)[0].lower()
                if not value and name.lower().endswith(first) and name.lower() != first:
                    value, name = name[: -len(first)], name[-len(first):]
                constrain(value)
                new(name, header.group(3), header.group(4))
            else:
                constrain(line)
            i += 1
            continue
        key = _KEY_LINE.match(line)
        header = _GLUED_HEADER.match(line)
        if key and not key.group(1):
            pending_key = key.group(2)
        elif header and not header.group(1):
            new(header.group(2), header.group(3), header.group(4))
        elif fields:
            fields[-1]["description"].append(line)
        i += 1
    for f in fields:
        f["description"] = " ".join(f["description"])
    return fields


def _walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, str, dict, bool]]:
    """Yield (path, name, property schema, required-in-parent) for every property."""
    node = schema.get("items", schema) if schema.get("type") == "array" else schema
    required = set(node.get("required", []))
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", name, sub, name in required
        yield from _walk(sub, f"{path}.{name}")


def _norm(text: str) -> str:
    return " ".join(text.split())


def _type_of(prop: dict[str, Any]) -> str:
    return "[]object" if prop.get("type") == "array" else prop.get("type", "")


def _constraints_of(prop: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in CONSTRAINTS:
        if key in prop:
            value = prop[key]
            out[key] = ", ".join(value) if key == "enum" else str(value)
    return out


def test_reference_parser_reads_the_page() -> None:
    fields = parse_reference(_need(REFERENCE_TEXT).read_text())
    names = [f["name"] for f in fields]
    for expected in ("spec", "default", "gpu", "members", "inferenceServiceRef", "name",
                     "nodeSelector", "swapBudget", "swapPolicy", "status", "conditions",
                     "residentMember", "pendingMember", "observedGeneration", "phase"):
        assert expected in names
    gpu = next(f for f in fields if f["name"] == "gpu")
    assert gpu["constraints"] == {"format": "int32", "minimum": "0"}
    members = next(f for f in fields if f["name"] == "members")
    assert members["required"] and members["constraints"] == {"minItems": "1"}


# Fields LLMKube's newer API rewrote since the reference page: matched by path, and the page's
# constraints extended by exactly these values (see modelpool_samples.newer_llmkube_schema).
NEWER_API_CHANGES = {".spec.swapPolicy": {"enum": "sticky, reclaim, reclaim-down"}}


def test_every_reference_field_is_in_our_crd() -> None:
    fields = parse_reference(_need(REFERENCE_TEXT).read_text())
    ours = list(_walk(_schema(MODELPOOL_CRD)))
    missing = []
    for field in fields:
        candidates = [(path, prop, req) for path, name, prop, req in ours
                      if name == field["name"]
                      and _norm(prop.get("description", "")) == _norm(field["description"])]
        if field["name"] == "metadata":
            candidates = [(p, prop, r) for p, n, prop, r in ours if p == ".metadata"]
        changed = [(p, prop, r) for p, n, prop, r in ours
                   if p in NEWER_API_CHANGES and n == field["name"]]
        if not candidates and changed:
            (path, prop, required), = changed
            field = {**field, "constraints": {**field["constraints"],
                                              **NEWER_API_CHANGES[path]}}
            candidates = changed
        if not candidates:
            missing.append(f"{field['name']}: no property with the reference description")
            continue
        path, prop, required = candidates[0]
        if _type_of(prop) != field["type"]:
            missing.append(f"{path}: type {_type_of(prop)} != {field['type']}")
        if required != field["required"]:
            missing.append(f"{path}: required {required} != {field['required']}")
        if _constraints_of(prop) != field["constraints"]:
            missing.append(f"{path}: {_constraints_of(prop)} != {field['constraints']}")
    assert not missing, "\n".join(missing)
    assert len(fields) >= 25


def test_swap_defaults_stated_in_reference() -> None:
    spec = _schema(MODELPOOL_CRD)["properties"]["spec"]["properties"]
    text = _need(REFERENCE_TEXT).read_text()
    assert "Defaults to 300s." in text and '"sticky" (default)' in text
    assert spec["swapBudget"]["default"] == "300s"
    assert spec["swapPolicy"]["default"] == "sticky"


# --- the minimal InferenceService CRD -----------------------------------------------------------

def _isvc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "judge", "namespace": "llm"},
            "spec": {"modelRef": "qwen-32b", "replicas": 0, **spec}}


def test_minimal_isvc_crd_shape() -> None:
    crd = _crd(ISVC_CRD)
    assert crd["metadata"]["name"] == "inferenceservices.inference.llmkube.dev"
    assert crd["metadata"]["labels"]["modelpool.inference.llmkube.dev/minimal-crd"] == "true"
    assert "install LLMKube's full CRD" in crd["metadata"]["annotations"][
        "modelpool.inference.llmkube.dev/note"]
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["names"]["shortNames"] == ["isvc"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Replicas", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    assert "minimal subset for modelpool-extproc" in schema["description"]
    assert schema["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] is True


def test_minimal_isvc_agrees_with_llmkube_on_the_fields_we_use() -> None:
    full = _schema(_need(LLMKUBE_ISVC))
    ours = _schema(ISVC_CRD)
    phases = full["properties"]["status"]["properties"]["phase"]["enum"]
    assert ours["properties"]["status"]["properties"]["phase"]["enum"] == phases
    # the scale subresource paths are the same as LLMKube's
    theirs_scale = _crd(LLMKUBE_ISVC)["spec"]["versions"][0]["subresources"]["scale"]
    assert _crd(ISVC_CRD)["spec"]["versions"][0]["subresources"]["scale"] == theirs_scale
    samples_ok = [_isvc(), _isvc(replicas=1),
                  {**_isvc(), "status": {"phase": "Ready", "replicas": 1, "readyReplicas": 1,
                                         "endpoint": "http://judge.llm.svc:8080"}}]
    for phase in phases:
        samples_ok.append({**_isvc(), "status": {"phase": phase}})
    for obj in samples_ok:
        assert errors(ours, obj) == [] and errors(full, obj) == [], obj
    samples_bad = [_isvc(replicas=-1), _isvc(replicas="1"),
                   {**_isvc(), "status": {"phase": "Running"}}]
    for obj in samples_bad:
        assert errors(ours, obj) and errors(full, obj), obj


def test_full_llmkube_object_still_validates_against_minimal_crd() -> None:
    obj = copy.deepcopy(_isvc(replicas=1))
    obj["spec"].update({"image": "ghcr.io/ggml-org/llama.cpp:server", "contextSize": 8192,
                        "resources": {"gpu": 1, "memory": "48Gi"}, "extraArgs": ["--jinja"]})
    assert errors(_schema(ISVC_CRD), obj) == []
