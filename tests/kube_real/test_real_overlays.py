"""`kubectl apply --dry-run=server` of every kustomization under deploy/, of the base with each
component (and an overlay with all of them), of the Helm chart's output for every documented
combination, and of the example pool, against a real API server
with the Gateway API and Envoy Gateway CRDs from ../shared installed: the server accepts every
object, its CRD schemas and CEL rules included.

Left out, because ../shared has no CRD for them: HTTPRouteFilter (gateway.envoyproxy.io;
tests/deploy/test_manifests.py checks it by hand) and the Prometheus Operator's kinds
(ServiceMonitor, PodMonitor, PrometheusRule; checked against the operator's own Go types by
tools/monitoringcheck in tests/deploy).
"""

from __future__ import annotations

import copy
import time
import urllib.error
from typing import Any

import pytest
import yaml

from control_plane import PROJECT_ROOT, SHARED_CRDS, ControlPlane
from helm import COMBINATIONS, render_chart
from kustomize import COMPONENTS, render_path

pytestmark = pytest.mark.kube_real

KUSTOMIZATIONS = sorted(str(p.parent.relative_to(PROJECT_ROOT))
                        for p in (PROJECT_ROOT / "deploy").glob("**/kustomization.yaml")
                        if "components" not in p.parts)
# each component on the base, and all of them on an overlay
WITH_COMPONENTS = [("deploy/base", (c,)) for c in COMPONENTS] + [
    ("deploy/overlays/envoy-gateway", tuple(COMPONENTS))]
NOT_INSTALLABLE = {("gateway.envoyproxy.io/v1alpha1", "HTTPRouteFilter"),
                   ("monitoring.coreos.com/v1", "ServiceMonitor"),
                   ("monitoring.coreos.com/v1", "PodMonitor"),
                   ("monitoring.coreos.com/v1", "PrometheusRule")}
REFERENCE_CRD_FILES = [SHARED_CRDS / "gateway-api" / "gateway-api-v1.6.1-crds.yaml",
                       *sorted((SHARED_CRDS / "envoy-gateway").glob("*.yaml"))]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def gateway_crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with the reference Gateway API and Envoy Gateway CRDs served."""
    if not REFERENCE_CRD_FILES[0].exists():
        pytest.skip(f"{REFERENCE_CRD_FILES[0]} is missing (../shared is not here)")
    names = []
    for path in REFERENCE_CRD_FILES:
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


def _submittable(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if (o["apiVersion"], o["kind"]) not in NOT_INSTALLABLE]


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
    """Every submittable object is accepted; only the known kinds were left out."""
    objects = _submittable(rendered)
    assert {(o["apiVersion"], o["kind"]) for o in rendered if o not in objects} \
        <= NOT_INSTALLABLE
    lines = _dry_run(plane, objects)
    assert len(lines) == len(objects) and all(line.endswith("(server dry run)")
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

