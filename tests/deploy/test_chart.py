"""The Helm chart: lints, renders every documented combination into objects that validate
against Kubernetes' and the upstream CRDs' schemas, and cannot drift from the kustomize tree.

Drift: both are rendered (chart defaults vs the Envoy Gateway overlay plus deploy/monitoring)
and every object both produce is compared after dropping what only one of them adds (labels,
the chart's release `instance` selector). Rendering both beats generating one from the other:
kustomize stays plain YAML an operator can read and patch, and the test names the field that
differs.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.cli import build_parser
from extproc.settings import Settings
from extproc.settings_sources import from_sources
from downward import POD_NAME, pod_env
from helm import CHART, COMBINATIONS, NAMESPACE, helm, render_chart, values_args
from k8s_schema import OPERATOR_KINDS as OPERATOR_KIND_NAMES
from k8s_schema import (BUILTIN_GROUPS, OUR_CRDS, PROJECT_ROOT, builtin_errors, errors, load_crds,
                        upstream_schemas)
from tools import tool_binary

# Prometheus Operator kinds: validated against the operator's CRDs like every other kind, and
# also decoded strictly into its Go API types (tools/monitoringcheck, a newer release) below.
OPERATOR_KINDS = set(OPERATOR_KIND_NAMES)


def _gvk(obj: dict[str, Any]) -> tuple[str, str, str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    return group, version, obj["kind"]


def _of(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = _of(objs, kind)
    return found


@pytest.fixture(scope="module")
def reference_crds() -> dict[tuple[str, str, str], dict[str, Any]]:
    """Upstream schemas from the Go module cache, and ours."""
    return upstream_schemas() | load_crds(OUR_CRDS)


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_helm_lint(combination: str) -> None:
    out = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE,
               *values_args(combination))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_every_object_validates(reference_crds, combination: str) -> None:
    objs = render_chart(combination)
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    for obj in objs:
        gvk = _gvk(obj)
        name = f"{gvk} {obj['metadata']['name']}"
        if gvk[0] in BUILTIN_GROUPS:
            assert builtin_errors(obj) == [], name
        else:
            assert gvk in reference_crds, f"no schema for {name}"
            assert errors(reference_crds[gvk], obj, strict=True) == [], name


def _operator_check(objs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    tool = tool_binary("MODELPOOL_MONITORING_CHECK_BIN", ".tools/bin/monitoringcheck",
                       "run `make ops-tools`: a Go build of tools/monitoringcheck")
    return subprocess.run([str(tool)], input=yaml.safe_dump_all(objs), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("combination", ["servicemonitor-values", "podmonitor-values"])
def test_prometheus_operator_objects_decode_strictly(render, combination: str) -> None:
    for objs in (render_chart(combination), render("deploy/monitoring")):
        wanted = [o for o in objs if o["kind"] in OPERATOR_KINDS]
        assert wanted
        out = _operator_check(objs)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"checked {len(wanted)} objects, 0 problems" in out.stdout
    # the check can fail: a misspelt field is refused
    monitor = next(o for o in render("deploy/monitoring") if o["kind"] == "ServiceMonitor")
    misspelt = {**monitor, "spec": {**monitor["spec"], "endpoints": [
        {**monitor["spec"]["endpoints"][0], "honourLabels": True}]}}
    out = _operator_check([misspelt])
    assert out.returncode == 1 and 'unknown field "honourLabels"' in out.stdout


def _container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = _one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _settings(container: dict[str, Any]) -> Settings:
    env = pod_env(container, NAMESPACE)
    for name in env:
        assert hasattr(Settings(), name.removeprefix("MODELPOOL_").lower()), \
            f"{name} is not a service setting"
    # the real command line: a flag it does not know fails here, not in the pod
    return from_sources(build_parser().parse_args(container["args"]), environ=env)


def _merged(base: Any, override: Any) -> Any:
    """``override`` over ``base`` as Helm merges values: maps key by key, anything else replaced."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    return {**base, **{k: _merged(base.get(k), v) for k, v in override.items()}}


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_deployment_runs_the_service_it_configures(combination: str) -> None:
    objs = render_chart(combination)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if combination != "default":
        values = _merged(values, yaml.safe_load((CHART / "ci" / f"{combination}.yaml").read_text()))
    dep = _one(objs, "Deployment")
    container = _container(objs)
    settings = _settings(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.listen.endswith(f":{ports['grpc']}")
    assert settings.metrics_listen.endswith(f":{ports['metrics']}")
    probes = {container[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe",
                                                     "livenessProbe")}
    # readiness follows the membership Lease; liveness survives an API server outage
    assert [container[p]["grpc"].get("service") for p in ("startupProbe", "readinessProbe",
                                                          "livenessProbe")] == [
        None, None, "liveness"]
    tls = values.get("tls", {}).get("enabled")
    if tls:  # the kubelet cannot speak TLS: health on its own plaintext port
        assert settings.tls_cert and settings.tls_key and settings.tls_client_ca
        assert probes == {ports["health"]} and settings.health_listen.endswith(
            f":{ports['health']}")
    else:
        assert probes == {ports["grpc"]} and not settings.health_listen
    assert dep["spec"]["replicas"] == values["replicas"]
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": values["rollingUpdate"]}
    pod = dep["spec"]["template"]["spec"]
    # each replica is its pod; its Leases in the release namespace, where their Role is
    assert settings.replica_name == POD_NAME and settings.lease_namespace == NAMESPACE
    (lease_role,) = [r for r in _of(objs, "Role") if r["metadata"]["name"].endswith("-leases")]
    assert lease_role["metadata"]["namespace"] == settings.lease_namespace
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace
    watch = values.get("watch", {})
    pool_roles = [r for r in _of(objs, "Role") if r is not lease_role]
    if watch.get("clusterWide"):
        assert settings.namespaces == [] and _of(objs, "ClusterRole") and not pool_roles
    else:
        wanted = watch.get("namespaces") or [NAMESPACE]
        assert settings.namespaces == wanted
        assert sorted(r["metadata"]["namespace"] for r in pool_roles) == sorted(wanted)
    for name, value in values.get("settings", {}).items():
        alone = from_sources(None, environ={f"MODELPOOL_{name.upper()}": str(value)})
        assert getattr(settings, name) == getattr(alone, name) != getattr(Settings(), name)
    image = values["image"]
    if image.get("digest"):
        assert container["image"] == f"{image['repository']}@{image['digest']}"
    else:
        assert container["image"] == f"{image['repository']}:0.1.0"
    for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
        if values.get(key):
            assert pod[key] == values[key], key
    # affinity: the value's, plus the chart's pod anti-affinity (podAntiAffinity.mode)
    affinity = dict(pod.get("affinity") or {})
    anti = affinity.pop("podAntiAffinity", None)
    assert affinity == {k: v for k, v in values["affinity"].items() if k != "podAntiAffinity"}
    assert anti == _anti_affinity(values, dep)


def _anti_affinity(values: dict[str, Any], dep: dict[str, Any]) -> dict[str, Any] | None:
    """The podAntiAffinity the values ask for: the value's own, or the chart's on the selector."""
    if "podAntiAffinity" in values["affinity"]:
        return values["affinity"]["podAntiAffinity"]
    mode, key = values["podAntiAffinity"]["mode"], values["podAntiAffinity"]["topologyKey"]
    term = {"topologyKey": key,
            "labelSelector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}
    if mode == "required":
        return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    if mode == "preferred":
        return {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": term}]}
    return None


def _values_with(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    return ["--values", str(path)]


def _template(*args: str) -> list[dict[str, Any]]:
    out = helm("template", "modelpool-extproc", str(CHART), "--namespace", NAMESPACE, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_pod_anti_affinity_modes(tmp_path: Path) -> None:
    def anti(text: str) -> Any:
        dep = _one(_template(*_values_with(tmp_path, text)), "Deployment")
        return (dep["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity")

    selector = {"app.kubernetes.io/name": "modelpool-extproc",
                "app.kubernetes.io/instance": "modelpool-extproc"}
    assert anti("{}") == {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": selector}}}]}
    assert anti("podAntiAffinity: {mode: required, topologyKey: topology.kubernetes.io/zone}") \
        == {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone",
             "labelSelector": {"matchLabels": selector}}]}
    assert anti("podAntiAffinity: {mode: ''}") is None
    # one of the operator's own replaces the chart's
    own = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname",
         "labelSelector": {"matchLabels": {"team": "ml"}}}]}
    assert anti(yaml.safe_dump({"affinity": {"podAntiAffinity": own}})) == own


def test_headless_service_for_a_standalone_envoy(render, tmp_path: Path) -> None:
    assert [o["metadata"]["name"] for o in _of(render_chart("default"), "Service")] == \
        ["modelpool-extproc"]  # off by default: Envoy Gateway balances over the endpoints
    objs = _template(*_values_with(tmp_path, "headlessService: {enabled: true}"))
    (headless,) = [o for o in _of(objs, "Service") if o["metadata"]["name"].endswith("-headless")]
    # the very Service the standalone overlay's Envoy reaches the replicas through
    overlay = [o for o in render("deploy/overlays/standalone-envoy") if o["kind"] == "Service"
               and o["metadata"]["name"] == headless["metadata"]["name"]]
    assert overlay and _normalised(headless) == _normalised(overlay[0])
    pods = _one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= pods.items()


def test_replicas_combination() -> None:
    objs = render_chart("replicas-values")
    dep = _one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 3
    # required anti-affinity and no spare node: replace in place, one pod at a time
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "requiredDuringSchedulingIgnoredDuringExecution" in dep["spec"]["template"]["spec"][
        "affinity"]["podAntiAffinity"]
    assert _one(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_flowschema_matches_exactly_the_lease_role(tmp_path: Path) -> None:
    assert not _of(render_chart("default"), "FlowSchema")
    for objs in (render_chart("replicas-values"),
                 _template("--set", "flowSchema.enabled=true", "--set", "watch.clusterWide=true",
                           "--set", "serviceAccount.create=false",
                           "--set", "serviceAccount.name=shared-sa")):
        schema = _one(objs, "FlowSchema")
        assert "namespace" not in schema["metadata"]  # cluster-scoped
        assert NAMESPACE in schema["metadata"]["name"]  # one per release namespace
        spec = schema["spec"]
        assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
        assert 0 < spec["matchingPrecedence"] < 9000
        (rule,) = spec["rules"]
        account = _one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {
            "name": account, "namespace": NAMESPACE}}]
        (lease_role,) = [r for r in _of(objs, "Role") if r["metadata"]["name"].endswith("-leases")]
        (granted,) = lease_role["rules"]
        (matched,) = rule["resourceRules"]
        assert matched == {**granted, "namespaces": [lease_role["metadata"]["namespace"]]}
        (binding,) = [b for b in _of(objs, "RoleBinding")
                      if b["roleRef"]["name"] == lease_role["metadata"]["name"]]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                        "namespace": NAMESPACE}]


def test_existing_gateway_and_pools_in_other_namespaces() -> None:
    objs = render_chart("existing-gateway-values")
    assert not _of(objs, "Gateway")
    routes = {r["metadata"]["namespace"]: r for r in _of(objs, "HTTPRoute")}
    assert set(routes) == {"team-a", "team-b"}
    for route in routes.values():
        assert route["spec"]["parentRefs"] == [{"name": "shared", "namespace": "gateways",
                                                "sectionName": "http"}]
    values = {r["matches"][0]["headers"][0]["value"]: r["backendRefs"][0]
              for r in routes["team-a"]["spec"]["rules"][:-1]}
    assert values == {"small.team-a": {"name": "small", "port": 8080},
                      "large.team-a": {"name": "large", "port": 8000}}
    # each pool namespace's policy reaches the ext_proc Service through a ReferenceGrant
    grants = {g["spec"]["from"][0]["namespace"]: g for g in _of(objs, "ReferenceGrant")}
    assert set(grants) == {"team-a", "team-b"}
    for policy in _of(objs, "EnvoyExtensionPolicy"):
        (ref,) = policy["spec"]["extProc"][0]["backendRefs"]
        assert ref["namespace"] == NAMESPACE
    ctp = _one(objs, "ClientTrafficPolicy")
    assert ctp["metadata"]["namespace"] == "gateways"
    assert sorted(b["metadata"]["namespace"] for b in _of(objs, "BackendTrafficPolicy")) == \
        ["team-a", "team-b"]


def test_cluster_wide_grants_what_the_namespaced_role_grants() -> None:
    (role,) = [r for r in _of(render_chart("default"), "Role")
               if not r["metadata"]["name"].endswith("-leases")]
    cluster = _one(render_chart("cluster-wide-values"), "ClusterRole")
    # the Leases keep their namespaced Role, the same in both modes
    leases = [[r for r in _of(render_chart(c), "Role") if r["metadata"]["name"].endswith("-leases")]
              for c in ("default", "cluster-wide-values")]
    assert leases[0] == leases[1] and len(leases[0]) == 1
    assert leases[0][0]["metadata"]["namespace"] == NAMESPACE
    assert leases[0][0]["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                      "verbs": ["get", "list", "watch", "create", "update",
                                                "delete"]}]
    # plus exactly what the route check (on in that combination) needs
    route_check = {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"],
                   "verbs": ["list"]}
    assert route_check not in role["rules"]
    assert cluster["rules"] == role["rules"] + [route_check]
    assert _settings(_container(render_chart("cluster-wide-values"))).route_check_interval == 60
    assert _settings(_container(render_chart("default"))).route_check_interval == 0
    binding = _one(render_chart("cluster-wide-values"), "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_monitoring_objects() -> None:
    objs = render_chart("servicemonitor-values")
    svc = _one(objs, "Service")
    monitor = _one(objs, "ServiceMonitor")
    labels = svc["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = _one(objs, "PrometheusRule")
    source = yaml.safe_load((PROJECT_ROOT / "deploy/monitoring/prometheusrule.yaml").read_text())
    assert rule["spec"] == source["spec"]
    dash = _one(objs, "ConfigMap")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["metadata"]["namespace"] == "monitoring"
    (text,) = dash["data"].values()
    assert json.loads(text) == json.loads(
        (PROJECT_ROOT / "deploy/monitoring/modelpool-dashboard.json").read_text())
    pod_objs = render_chart("podmonitor-values")
    assert not _of(pod_objs, "ServiceMonitor")
    pod_monitor = _one(pod_objs, "PodMonitor")
    template_labels = _one(pod_objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(template_labels.get(k) == v
               for k, v in pod_monitor["spec"]["selector"]["matchLabels"].items())
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    assert not [o for o in pod_objs if _gvk(o)[0].endswith("envoyproxy.io")
                or _gvk(o)[0] == "gateway.networking.k8s.io"]


@pytest.mark.parametrize("bad, complaint", [
    ("replicas: -1", "/replicas"),
    ("podAntiAffinity: {mode: always}", "/podAntiAffinity/mode"),
    ("rollingUpdate: {maxSurge: one}", "/rollingUpdate/maxSurge"),
    ("flowSchema: {enabled: true, matchingPrecedence: 9000}", "matchingPrecedence"),
    # every pod sets these from the downward API: one value for all replicas would be wrong
    ("settings: {replica_name: extproc}", "/settings"),
    ("settings: {lease_namespace: other}", "/settings"),
    ("image: {tagg: v1}", "tagg"),  # a misspelt value is an error, not silently ignored
    ("image: {digest: latest}", "/image/digest"),
    ("envoyGateway: {extensionPolicy: {messageTimeout: 330}}", "messageTimeout"),
])
def test_values_schema_refuses_bad_values(tmp_path: Path, bad: str, complaint: str) -> None:
    values = tmp_path / "bad.yaml"
    values.write_text(bad)
    out = helm("lint", str(CHART), "--values", str(values))
    assert out.returncode != 0 and complaint in out.stdout + out.stderr


def test_both_monitors_at_once_is_refused(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text("monitoring: {serviceMonitor: {enabled: true}, podMonitor: {enabled: true}}")
    out = helm("template", "x", str(CHART), "--values", str(both))
    assert out.returncode != 0 and "not both" in out.stderr


def test_chart_crds_are_the_projects() -> None:
    chart_crds = sorted((CHART / "crds").glob("*.yaml"))
    assert [p.name for p in chart_crds] == sorted(p.name for p in OUR_CRDS.glob("*_*.yaml"))
    for path in chart_crds:
        assert path.read_text() == (OUR_CRDS / path.name).read_text()
    # Helm applies crds/ itself and never deletes them; no template may own a CRD
    for combination in COMBINATIONS:
        assert not _of(render_chart(combination), "CustomResourceDefinition")
        assert not _of(render_chart(combination), "Namespace")


def test_package_carries_the_linked_files(tmp_path: Path) -> None:
    # what `helm push oci://...` publishes: the links (CRDs, dashboard, rules) become files
    out = helm("package", str(CHART), "--destination", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (archive,) = tmp_path.glob("modelpool-extproc-*.tgz")
    with tarfile.open(archive) as tar:
        for member in ("crds/inference.llmkube.dev_modelpools.yaml",
                       "files/modelpool-dashboard.json", "files/prometheusrule.yaml"):
            entry = tar.getmember(f"modelpool-extproc/{member}")
            assert entry.isfile()
            assert tar.extractfile(entry).read() == (CHART / member).read_bytes()


# --- drift between the chart and the kustomize tree ---------------------------------------------

def _normalised(obj: Any) -> Any:
    """``obj`` without what only the chart (release labels) or only kustomize adds."""
    if isinstance(obj, list):
        return [_normalised(item) for item in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        if key in ("labels", "annotations"):
            continue
        if key == "app.kubernetes.io/instance":
            continue  # the chart's release selector label; kustomize has no release
        out[key] = _normalised(value)
    return out


def test_chart_and_kustomize_cannot_drift(render) -> None:
    kustomized = render("deploy/overlays/envoy-gateway") + render("deploy/monitoring")
    chart = render_chart("servicemonitor-values")
    ours = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
            for o in kustomized}
    common = 0
    for obj in chart:
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if obj["kind"] == "ConfigMap":
            continue  # the dashboard: compared by content in test_monitoring_objects
        assert key in ours, f"the chart renders {key}, kustomize does not"
        assert _normalised(obj) == _normalised(ours[key]), key
        common += 1
    # everything kustomize renders, the chart renders too (the ConfigMap aside)
    assert common == len([o for o in kustomized if o["kind"] != "ConfigMap"])
