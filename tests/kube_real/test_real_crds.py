"""The ModelPool corpus (tests/deploy/modelpool_samples.py) submitted to a real kube-apiserver,
once with our CRD and once with LLMKube's: the same verdicts, and the server applies defaults.

The API emulator (devstack/kubeapi) does not validate against the CRD schema, so it accepts
every INVALID sample, `swapPolicy: priority`, `members: []` and `gpu: -1` among them; the
real server rejects them all. Spec samples go in as a dry-run create; on create the server
drops `.status` (the status subresource is on), so status samples are checked as a dry-run
write to `/status` of a real pool made for the purpose.
"""

from __future__ import annotations

import copy
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from control_plane import CRDS, SHARED_CRDS, ControlPlane
from modelpool_samples import INVALID, VALID, pool

pytestmark = pytest.mark.kube_real

POOLS = "/apis/inference.llmkube.dev/v1alpha1/namespaces/{ns}/modelpools"
POOL_CRD = "modelpools.inference.llmkube.dev"
OURS = CRDS / "inference.llmkube.dev_modelpools.yaml"
THEIRS = SHARED_CRDS / "llmkube" / "inference.llmkube.dev_modelpools.yaml"
NAMESPACE = "llm"  # the corpus' namespace


def _submit(plane: ControlPlane, name: str, sample: dict[str, Any]) -> tuple[bool, str]:
    """(accepted, the server's message) for one corpus sample."""
    obj = copy.deepcopy(sample)
    status = obj.pop("status", None)
    obj["metadata"]["name"] = "s-" + "".join(c if c.isalnum() else "-" for c in name.lower())
    base = POOLS.format(ns=NAMESPACE)
    try:
        if status is None:
            plane.request("POST", f"{base}?dryRun=All", obj)
            return True, ""
        plane.request("POST", base, obj)
        try:
            plane.request("PATCH", f"{base}/{obj['metadata']['name']}/status?dryRun=All",
                          {"status": status}, content_type="application/merge-patch+json")
        finally:
            plane.request("DELETE", f"{base}/{obj['metadata']['name']}")
        return True, ""
    except urllib.error.HTTPError as exc:
        return False, f"{exc.code} {exc.read().decode()[:300]}"


def _verdicts(plane: ControlPlane) -> dict[str, Any]:
    """Every sample's verdict, and the defaulted spec of the minimal pool."""
    samples = {**VALID, **INVALID}
    defaulted = plane.request("POST", f"{POOLS.format(ns=NAMESPACE)}?dryRun=All", pool())
    return {"samples": {name: _submit(plane, name, s) for name, s in samples.items()},
            "defaults": defaulted["spec"]}


def _install_pool_crd(plane: ControlPlane, path: Any) -> None:
    plane.kubectl("delete", "crd", POOL_CRD, "--ignore-not-found", "--wait=true")
    plane.apply_file(path)
    plane.wait_established(POOL_CRD)


@pytest.fixture(scope="module")
def verdicts(control_plane: ControlPlane) -> Iterator[dict[str, dict[str, Any]]]:
    """Verdicts with our CRD, then with LLMKube's (swapped in, then ours put back)."""
    if not THEIRS.exists():
        pytest.skip(f"{THEIRS} is missing: LLMKube's own CRD (config/crd/bases of LLMKube's "
                    "repository, in no Go module) is read from the reference folder beside the "
                    "clone, ../shared/reference/crds/llmkube, which is not here")
    control_plane.ensure_namespace(NAMESPACE)
    ours = _verdicts(control_plane)
    try:
        _install_pool_crd(control_plane, THEIRS)
        theirs = _verdicts(control_plane)
    finally:
        _install_pool_crd(control_plane, OURS)
    yield {"ours": ours, "llmkube": theirs}


@pytest.mark.parametrize("crd", ["ours", "llmkube"])
def test_valid_samples_accepted(verdicts: dict[str, dict[str, Any]], crd: str) -> None:
    rejected = {name: verdicts[crd]["samples"][name][1] for name in VALID
                if not verdicts[crd]["samples"][name][0]}
    assert rejected == {}


@pytest.mark.parametrize("crd", ["ours", "llmkube"])
def test_invalid_samples_rejected(verdicts: dict[str, dict[str, Any]], crd: str) -> None:
    accepted = [name for name in INVALID if verdicts[crd]["samples"][name][0]]
    assert accepted == []
    # the three the emulator lets through, rejected for the right reason
    messages = verdicts[crd]["samples"]
    assert "422" in messages["bad swapPolicy"][1] and "swapPolicy" in messages["bad swapPolicy"][1]
    assert "members" in messages["empty members"][1]
    assert "gpu" in messages["negative gpu"][1]


def test_same_verdicts_with_both_crds(verdicts: dict[str, dict[str, Any]]) -> None:
    ours = {name: ok for name, (ok, _) in verdicts["ours"]["samples"].items()}
    theirs = {name: ok for name, (ok, _) in verdicts["llmkube"]["samples"].items()}
    assert ours == theirs


def test_server_applies_defaults(verdicts: dict[str, dict[str, Any]]) -> None:
    for crd in ("ours", "llmkube"):
        spec = verdicts[crd]["defaults"]
        assert (spec["swapPolicy"], spec["swapBudget"]) == ("sticky", "300s"), crd
    # LLMKube's CRD also defaults gpu to 1; ours states no default (see tests/deploy)
    assert verdicts["llmkube"]["defaults"].get("gpu") == 1
    assert "gpu" not in verdicts["ours"]["defaults"]
