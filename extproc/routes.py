"""Routes that follow the pool: render each member's route from a ModelPool, find the missing.

Every member needs its own route (routing-header value -> the member's Service): one
HTTPRoute rule under Envoy Gateway, one cluster and one route in the standalone Envoy. Written by hand, a
member added to a ModelPool stays unroutable until someone edits the route; rendered from the
pool, it cannot be forgotten. ``modelpool-extproc render-routes`` prints them and
``check-config --routes`` warns about members that rendered manifests do not route.

Service convention: a member's Service has the InferenceService's name (LLMKube creates one
per InferenceService) and listens on port 8080 (LLMKube's default). ``--service-template``
changes the name for every member; the ModelPool annotation
``modelpool.inference.llmkube.dev/member-ports: "large=8000,small=8081"`` sets ports per member.
A member's fallback (``modelpool.inference.llmkube.dev/fallbacks``, platform/kube/activation.py)
gets a route too, whose responses say so in ``x-modelpool-fallback``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from .protocol.answers import FALLBACK_HEADER, METADATA_KEY, METADATA_NAMESPACE, fallback_note
from .settings import Settings
from extproc.names import PORTS_ANNOTATION

DEFAULT_PORT = 8080
#: The catch-all's direct 503 (an Envoy Gateway HTTPRouteFilter in the pool's namespace).
UNAVAILABLE_FILTER = "modelpool-router-unavailable"
FORMATS = ("httproute", "helm-values", "envoy-clusters", "envoy-routes", "inferencepool")
# Held requests are released to the new member together; Envoy's default of 1,024 pending or
# active requests per cluster would turn a large release into 503s.
_BREAKER = {"priority": "DEFAULT", "max_connections": 100000, "max_pending_requests": 100000,
            "max_requests": 100000}


@dataclass(frozen=True, slots=True)
class MemberRoute:
    """Where one member's requests go: the routing-header value and the member's Service."""

    pool: str
    namespace: str
    member: str
    value: str
    service: str
    port: int
    fallback: str = ""  # a fallback's x-modelpool-fallback answer header ("": a member)


def load_pools(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every ModelPool object in the given YAML files (other kinds are skipped)."""
    pools = []
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ModelPool":
                pools.append(doc)
    if not pools:
        raise ValueError(f"no ModelPool in {', '.join(map(str, paths))}")
    return pools


def member_routes(pool: dict[str, Any], settings: Settings, *,
                  service_template: str = "{member}",
                  default_port: int = DEFAULT_PORT) -> list[MemberRoute]:
    """The routes a ModelPool's members need, in the order the pool lists them."""
    from .platform.kube.activation import fallback_backends, fallback_value
    from .platform.kube.objects import pool_spec  # the service's own reading of a ModelPool

    spec, problems = pool_spec(pool, settings)
    if problems:
        raise ValueError(f"ModelPool {spec.key}: {'; '.join(problems)}")
    annotations = (pool.get("metadata") or {}).get("annotations") or {}
    ports = _ports(annotations.get(PORTS_ANNOTATION, ""), spec.members)
    key = spec.key
    routes = [MemberRoute(key.name, key.namespace, m,
                          settings.route_template.format(member=m, pool=key.name,
                                                         namespace=key.namespace),
                          service_template.format(member=m, pool=key.name,
                                                  namespace=key.namespace),
                          ports.get(m, default_port)) for m in spec.members]
    for member, (service, port) in fallback_backends(annotations, spec.members, []).items():
        value = fallback_value(service, key.namespace)
        if all(r.value != value for r in routes):  # members may share a fallback
            routes.append(MemberRoute(key.name, key.namespace, member, value, service, port,
                                      fallback_note(value)))
    return routes


def _ports(text: str, members: tuple[str, ...]) -> dict[str, int]:
    ports: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        member, sep, port = item.partition("=")
        if not sep or member.strip() not in members or not port.strip().isdigit():
            raise ValueError(f"annotation {PORTS_ANNOTATION}: bad entry {item!r} "
                             "(want member=port for a member of the pool)")
        ports[member.strip()] = int(port)
    return ports


def httproute(routes: list[MemberRoute], settings: Settings, gateway: str) -> dict[str, Any]:
    """The pool's HTTPRoute: one header-matched rule per member, then the catch-all 503."""
    first = routes[0]
    rules: list[dict[str, Any]] = [{
        "matches": [{"headers": [{"name": settings.route_header, "type": "Exact",
                                  "value": r.value}]}],
        "backendRefs": [{"name": r.service, "port": r.port}],
        # no route timeout: park time does not count, but 15 s would cut long generations
        "timeouts": {"request": "0s"}} | _says_fallback(r) for r in routes]
    rules.append({"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                  "filters": [{"type": "ExtensionRef", "extensionRef": {
                      "group": "gateway.envoyproxy.io", "kind": "HTTPRouteFilter",
                      "name": UNAVAILABLE_FILTER}}]})
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": first.pool, "namespace": first.namespace},
            "spec": {"parentRefs": [{"name": gateway}], "rules": rules}}


def _says_fallback(route: MemberRoute) -> dict[str, Any]:
    """A fallback's rule answers with the header that says so (Envoy Gateway cannot copy it
    from the service's metadata as the standalone Envoy does)."""
    if not route.fallback:
        return {}
    return {"filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
        "set": [{"name": FALLBACK_HEADER, "value": route.fallback}]}}]}


def helm_values(routes: list[MemberRoute]) -> dict[str, Any]:
    """One entry of the chart's ``pools`` list."""
    first = routes[0]
    return {"name": first.pool, "namespace": first.namespace,
            "members": [{"name": r.member, "value": r.value, "service": r.service,
                         "port": r.port} | ({"fallback": r.fallback} if r.fallback else {})
                        for r in routes]}


def envoy_clusters(routes: list[MemberRoute]) -> list[dict[str, Any]]:
    """Standalone Envoy clusters, named by routing-header value, resolved by cluster DNS
    (connect timeout 5 s: a release's burst of connections may overflow a member's accept
    queue, and the resent SYNs come after 1 s and 3 s)."""
    return [{"name": r.value, "type": "STRICT_DNS", "connect_timeout": "5s",
             "circuit_breakers": {"thresholds": [dict(_BREAKER)]},
             "load_assignment": {"cluster_name": r.value, "endpoints": [{"lb_endpoints": [{
                 "endpoint": {"address": {"socket_address": {
                     "address": f"{r.service}.{r.namespace}.svc.cluster.local",
                     "port_value": r.port}}}}]}]}} for r in routes]


def envoy_routes(routes: list[MemberRoute], settings: Settings) -> list[dict[str, Any]]:
    """Standalone Envoy routes for the one-message mode: each matches the member the service
    names in dynamic metadata (Envoy drops a body answer's header mutations when the headers
    message was skipped) and adds the routing header for the member and the access log."""
    return [{"name": f"member.{r.value}",
             "match": {"prefix": "/", "dynamic_metadata": [{
                 "filter": METADATA_NAMESPACE, "path": [{"key": METADATA_KEY}],
                 "value": {"string_match": {"exact": r.value}}}]},
             "route": {"cluster": r.value, "timeout": "0s", "idle_timeout": "600s"},
             "request_headers_to_add": [{
                 "header": {"key": settings.route_header,
                            "value": f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:{METADATA_KEY})%"},
                 "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]} for r in routes]


def render(pools: list[dict[str, Any]], settings: Settings, fmt: str, *,
           gateway: str = "modelpool", service_template: str = "{member}",
           default_port: int = DEFAULT_PORT) -> str:
    """The YAML text ``render-routes`` prints for ``pools`` in format ``fmt``."""
    per_pool = [member_routes(p, settings, service_template=service_template,
                              default_port=default_port) for p in pools]
    if fmt == "httproute":
        return yaml.safe_dump_all([httproute(r, settings, gateway) for r in per_pool],
                                  sort_keys=False)
    if fmt == "helm-values":
        return yaml.safe_dump({"pools": [helm_values(r) for r in per_pool]}, sort_keys=False)
    if fmt == "envoy-clusters":
        return yaml.safe_dump([c for r in per_pool for c in envoy_clusters(r)],
                              sort_keys=False)
    if fmt == "inferencepool":  # behind an InferencePool gateway (inference_pool.py)
        from .inference_pool import render as render_pools

        return render_pools([(r[0].namespace, r[0].pool, tuple(m.member for m in r))
                             for r in per_pool], gateway, default_port)
    if fmt == "envoy-routes":
        return yaml.safe_dump([c for r in per_pool for c in envoy_routes(r, settings)],
                              sort_keys=False)
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def routed_values(path: str | Path) -> set[str]:
    """Routing-header values that rendered manifests route: HTTPRoute header matches and
    Envoy cluster names (a kustomize or helm rendering, or an Envoy config, or a ConfigMap
    holding one)."""
    from .platform.kube.routecheck import header_values  # the service's own reading

    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict)]
    values = header_values(d for d in docs if d.get("kind") == "HTTPRoute")
    for doc in docs:
        if doc.get("kind") == "HTTPRoute":
            continue
        if doc.get("kind") == "ConfigMap":
            for text in (doc.get("data") or {}).values():
                values |= _envoy_cluster_names(yaml.safe_load(text))
        else:
            values |= _envoy_cluster_names(doc)
    return values


def _envoy_cluster_names(config: Any) -> set[str]:
    if not isinstance(config, dict):
        return set()
    clusters = (config.get("static_resources") or {}).get("clusters") or []
    return {c.get("name", "") for c in clusters if isinstance(c, dict)}


def unrouted(routes: Iterable[MemberRoute], routed: set[str]) -> list[MemberRoute]:
    """The members whose routing-header value no rendered route matches."""
    return [r for r in routes if r.value not in routed]
