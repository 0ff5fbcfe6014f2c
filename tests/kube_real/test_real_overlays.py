"""`kubectl apply --dry-run=server` of every kustomization under deploy/, of the base with each
component (and an overlay with all of them), of the Helm chart's output for every documented
combination, and of the example pool, against a real API server with the upstream CRDs
installed from the Go modules their projects publish (Gateway API, Envoy Gateway with
HTTPRouteFilter, the inference extension's InferencePool, the Prometheus Operator's
ServiceMonitor, PodMonitor and PrometheusRule; devstack/upstream_crds.py): the server accepts
every object, its CRD schemas and CEL rules included.
"""

from __future__ import annotations

import copy
import time
import urllib.error
from typing import Any

import pytest
import yaml

from control_plane import PROJECT_ROOT, ControlPlane
from k8s_schema import upstream_crd_files
from helm import COMBINATIONS, render_chart
from kustomize import COMPONENTS, render_path

pytestmark = pytest.mark.kube_real

KUSTOMIZATIONS = sorted(str(p.parent.relative_to(PROJECT_ROOT))
                        for p in (PROJECT_ROOT / "deploy").glob("**/kustomization.yaml")
                        if "components" not in p.parts)
# each component on the base, and all of them on an overlay
WITH_COMPONENTS = [("deploy/base", (c,)) for c in COMPONENTS] + [
    ("deploy/overlays/envoy-gateway", tuple(COMPONENTS))]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def gateway_crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with the upstream CRDs (Gateway API, Envoy Gateway, the operator's
    kinds) served."""
    names = []
    for path in upstream_crd_files():
        control_plane.apply_file(path)
        names += [d["metadata"]["name"] for d in _docs(path.read_text())
                  if d.get("kind") == "CustomResourceDefinition"]
    control_plane.wait_established(*names)
    return control_plane


def _dry_run(plane: ControlPlane, objects: list[dict[str, Any]]) -> list[str]:
    """Create the objects' namespaces for real, dry-run apply the rest; kubectl's lines."""
    for ns in {o["metadata"].get("namespace") for o in objects} - {None}:
        plane.ensure_namespace(ns)
    done = plane.kubectl("apply", "--dry-run=server", "-f", "-", check=False,
                         stdin=yaml.safe_dump_all(objects))
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_server_accepts_every_object(gateway_crds: ControlPlane, path: str) -> None:
    _accepted(gateway_crds, _docs(gateway_crds.kubectl("kustomize",
                                                       str(PROJECT_ROOT / path)).stdout))


@pytest.mark.parametrize("path, components", WITH_COMPONENTS,
                         ids=[f"{p}+{'+'.join(c.rsplit('/', 1)[-1] for c in cs)}"
                              for p, cs in WITH_COMPONENTS])
def test_server_accepts_every_object_with_components(gateway_crds: ControlPlane, path: str,
                                                     components: tuple[str, ...]) -> None:
    _accepted(gateway_crds, copy.deepcopy(render_path(path, components)))


def test_flowschema_priority_level_is_served(control_plane: ControlPlane) -> None:
    """The level the FlowSchema names is one the API server itself creates (suggested config)."""
    for objects in (render_path("deploy/base", ("deploy/components/flowschema",)),
                    render_chart("replicas-values")):
        (schema,) = [o for o in objects if o["kind"] == "FlowSchema"]
        level = schema["spec"]["priorityLevelConfiguration"]["name"]
        path = f"/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/{level}"
        deadline = time.monotonic() + 20  # the API server writes its suggested config at start
        while True:
            try:
                found = control_plane.request("GET", path)
                break
            except urllib.error.HTTPError as exc:
                if exc.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert found["spec"]["type"] == "Limited", found["spec"]


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_server_accepts_the_charts_output(gateway_crds: ControlPlane, combination: str) -> None:
    _accepted(gateway_crds, copy.deepcopy(render_chart(combination)))


def _accepted(plane: ControlPlane, rendered: list[dict[str, Any]]) -> None:
    """Every object is accepted, none left out (every kind's CRD is installed)."""
    lines = _dry_run(plane, rendered)
    assert len(lines) == len(rendered) and all(line.endswith("(server dry run)")
                                               for line in lines), lines


def test_server_accepts_the_example_pool(gateway_crds: ControlPlane) -> None:
    objects = _docs((PROJECT_ROOT / "deploy" / "examples" / "shared-gpu.yaml").read_text())
    assert len(_dry_run(gateway_crds, objects)) == len(objects)


def test_cel_rules_are_enforced(gateway_crds: ControlPlane) -> None:
    """A negative control: an HTTPRoute breaking one of the Gateway API CRD's CEL rules."""
    overlay = _docs(gateway_crds.kubectl(
        "kustomize", str(PROJECT_ROOT / "deploy" / "overlays" / "envoy-gateway")).stdout)
    route = copy.deepcopy(next(o for o in overlay if o["kind"] == "HTTPRoute"))
    route["spec"]["rules"][0]["matches"][0]["path"] = {"type": "PathPrefix", "value": "v1"}
    gateway_crds.ensure_namespace(route["metadata"]["namespace"])
    done = gateway_crds.kubectl("apply", "--dry-run=server", "-f", "-", check=False,
                                stdin=yaml.safe_dump(route))
    assert done.returncode != 0
    assert "must be an absolute path" in done.stderr, done.stderr



@pytest.mark.parametrize("kind, path, field", [
    ("ServiceMonitor", "deploy/monitoring", "honourLabels"),
    ("HTTPRouteFilter", "deploy/overlays/envoy-gateway", "directResponce"),
    ("InferencePool", "deploy/overlays/inference-pool", "endpointPicker")])
def test_upstream_schemas_are_enforced(gateway_crds: ControlPlane, kind: str, path: str,
                                       field: str) -> None:
    """Negative controls for the CRDs from the Go modules: a misspelt field is refused."""
    obj = copy.deepcopy(next(o for o in render_path(path) if o["kind"] == kind))
    obj["spec"][field] = {}
    gateway_crds.ensure_namespace(obj["metadata"]["namespace"])
    done = gateway_crds.kubectl("apply", "--dry-run=server", "-f", "-", check=False,
                                stdin=yaml.safe_dump(obj))
    assert done.returncode != 0
    assert f'unknown field "spec.{field}"' in done.stderr, done.stderr


def test_inference_pool_cel_rule_is_enforced(gateway_crds: ControlPlane) -> None:
    """The InferencePool CRD's own rule: a Service picker needs its port."""
    pool = copy.deepcopy(next(o for o in render_path("deploy/overlays/inference-pool")
                              if o["kind"] == "InferencePool"))
    del pool["spec"]["endpointPickerRef"]["port"]
    gateway_crds.ensure_namespace(pool["metadata"]["namespace"])
    done = gateway_crds.kubectl("apply", "--dry-run=server", "-f", "-", check=False,
                                stdin=yaml.safe_dump(pool))
    assert done.returncode != 0
    assert "port is required when kind is 'Service'" in done.stderr, done.stderr
