"""Where the upstream CRDs come from (devstack/upstream_crds.py): the pins agree with the
Makefile's, a missing record says how to get it, and under CI=true it fails instead of skipping."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from devstack import upstream_crds
from k8s_schema import PROJECT_ROOT


def _makefile_var(name: str) -> str:
    (value,) = re.findall(rf"^{name} := (\S+)$", (PROJECT_ROOT / "Makefile").read_text(), re.M)
    return value


def test_envoy_gateway_crds_are_of_the_release_egctl_is_built_at() -> None:
    assert upstream_crds.SOURCES["envoy-gateway"].version == _makefile_var("EG_VERSION")


def test_a_missing_record_says_how_to_get_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(upstream_crds.RECORD_ENV, str(tmp_path / "absent.json"))
    with pytest.raises(FileNotFoundError, match="make schemas"):
        upstream_crds.files("gateway-api")


def test_a_record_of_another_version_is_refused(tmp_path: Path, monkeypatch) -> None:
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"gateway-api": {"version": "v0.0.1", "crd_dir": str(tmp_path)}}))
    monkeypatch.setenv(upstream_crds.RECORD_ENV, str(record))
    with pytest.raises(FileNotFoundError, match="v0.0.1"):
        upstream_crds.crd_dir("gateway-api")


def test_only_files_holding_crds_are_listed(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "x.example.io_widgets.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    (tmp_path / "x.example.io_vap.yaml").write_text(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n")
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"gateway-api": {
        "version": upstream_crds.SOURCES["gateway-api"].version, "crd_dir": str(tmp_path)}}))
    monkeypatch.setenv(upstream_crds.RECORD_ENV, str(record))
    assert [p.name for p in upstream_crds.files("gateway-api")] == ["x.example.io_widgets.yaml"]
    assert upstream_crds.files("gateway-api", ("Gadget",)) == []


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)])
def test_need_skips_but_fails_under_ci(tmp_path: Path, monkeypatch, ci: str, outcome) -> None:
    monkeypatch.setenv(upstream_crds.RECORD_ENV, str(tmp_path / "absent.json"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="make schemas"):
        upstream_crds.need(upstream_crds.files, "envoy-gateway")
