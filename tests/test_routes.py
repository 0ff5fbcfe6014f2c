"""Routes follow the pool: `render-routes` renders exactly the routes the shipped manifests
carry (kustomize overlays, chart values), and `check-config --routes` names a member that
rendered manifests leave unroutable."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extproc.routes import load_pools, render
from extproc.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "deploy" / "examples" / "shared-gpu.yaml"
CLI = [sys.executable, "-m", "extproc"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_httproute_is_the_envoy_gateway_overlays() -> None:
    out = _cli("render-routes", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    (rendered,) = yaml.safe_load_all(out.stdout)
    shipped = yaml.safe_load((ROOT / "deploy/overlays/envoy-gateway/httproute.yaml").read_text())
    assert rendered == shipped


def test_envoy_clusters_are_the_standalone_configs() -> None:
    out = _cli("render-routes", str(EXAMPLE), "--format", "envoy-clusters")
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((ROOT / "deploy/overlays/standalone-envoy/envoy.yaml").read_text())
    members = [c for c in config["static_resources"]["clusters"]
               if c["name"] not in ("admin", "modelpool-extproc")]
    assert yaml.safe_load(out.stdout) == members


def test_envoy_routes_are_the_standalone_configs() -> None:
    out = _cli("render-routes", str(EXAMPLE), "--format", "envoy-routes")
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((ROOT / "deploy/overlays/standalone-envoy/envoy.yaml").read_text())
    listener = next(x for x in config["static_resources"]["listeners"]
                    if x["name"] == "modelpool")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = [r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
              if r["name"].startswith("member.")]
    assert yaml.safe_load(out.stdout) == routes


def test_helm_values_are_the_charts_defaults() -> None:
    out = _cli("render-routes", str(EXAMPLE), "--format", "helm-values")
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)["pools"]
    chart = yaml.safe_load((ROOT / "charts/modelpool-extproc/values.yaml").read_text())["pools"]
    # the chart's "" means the release namespace, which is the example pool's (llm)
    assert rendered == [pool | {"namespace": pool["namespace"] or "llm"} for pool in chart]


def test_ports_annotation_service_template_and_errors(tmp_path: Path) -> None:
    pool = yaml.safe_load(EXAMPLE.read_text())
    pool["metadata"]["annotations"] = {
        "modelpool.inference.llmkube.dev/member-ports": "coder=8000"}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    values = yaml.safe_load(render(load_pools([path]), Settings(), "helm-values",
                                   service_template="{member}-svc"))
    assert [(m["service"], m["port"]) for m in values["pools"][0]["members"]] == [
        ("judge-svc", 8080), ("coder-svc", 8000), ("writer-svc", 8080)]
    pool["metadata"]["annotations"]["modelpool.inference.llmkube.dev/member-ports"] = "nobody=1"
    path.write_text(yaml.safe_dump(pool))
    out = _cli("render-routes", str(path))
    assert out.returncode != 0 and "member-ports" in out.stderr
    path.write_text("kind: ConfigMap\n")
    assert "no ModelPool" in _cli("render-routes", str(path)).stderr


@pytest.fixture(scope="module")
def rendered_overlays(tmp_path_factory) -> dict[str, Path]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH (needed for `kubectl kustomize`)")
    out_dir = tmp_path_factory.mktemp("rendered")
    paths = {}
    for overlay in ("envoy-gateway", "standalone-envoy"):
        text = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy/overlays" / overlay)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
        paths[overlay] = out_dir / f"{overlay}.yaml"
        paths[overlay].write_text(text)
    return paths


@pytest.mark.parametrize("overlay", ["envoy-gateway", "standalone-envoy"])
def test_check_config_warns_about_a_member_without_a_route(rendered_overlays, overlay,
                                                           tmp_path: Path) -> None:
    routes = str(rendered_overlays[overlay])
    quiet = _cli("check-config", "--modelpool", str(EXAMPLE), "--routes", routes)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    pool = yaml.safe_load(EXAMPLE.read_text())
    pool["spec"]["members"].append({"inferenceServiceRef": {"name": "newcomer"}})
    grown = tmp_path / "grown.yaml"
    grown.write_text(yaml.safe_dump(pool))
    out = _cli("check-config", "--modelpool", str(grown), "--routes", routes)
    assert out.returncode == 0, out.stderr
    (warning,) = [line for line in out.stderr.splitlines() if line.startswith("warning")]
    assert "member newcomer of pool llm/shared-gpu has no route" in warning
    assert "x-modelpool-member: newcomer.llm" in warning


def test_check_config_reads_a_static_pools_file_too(rendered_overlays, tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump({"pools": [{"namespace": "llm", "name": "shared-gpu",
                                                "members": ["judge", "ghost"]}]}))
    out = _cli("check-config", "--pools-file", str(pools), "--routes",
               str(rendered_overlays["envoy-gateway"]))
    assert out.returncode == 0, out.stderr
    assert [line.split()[2] for line in out.stderr.splitlines()
            if line.startswith("warning")] == ["ghost"]
