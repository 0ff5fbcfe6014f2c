"""Render envoy/envoy.yaml with other ports and member clusters (tests, the local stack)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import yaml

from extproc.protocol.service import SERVICE

TEMPLATE = Path(__file__).resolve().parent.parent / "envoy" / "envoy.yaml"
EXTPROC_CLUSTER = "extproc"
EXTPROC_FILTER = "envoy.filters.http.ext_proc"
HCM_FILTER = "envoy.filters.network.http_connection_manager"
BUFFER_FILTER = "envoy.filters.http.buffer"
# The template's routes that match the service's dynamic metadata, one per member cluster.
MEMBER_ROUTE_PREFIX = "member."
# Several ext_proc replicas: Envoy asks each for its gRPC health (the service name the service
# registers beside "") every half second, and one failed or NOT_SERVING answer is enough to
# stop sending it new streams (a replica that cannot renew its Lease says NOT_SERVING), one
# SERVING answer to send them again. Envoy's default no-traffic interval is 60 s: an idle demo
# would notice a dead replica a minute late. A killed replica fails its next check at once
# (connection refused); the timeout only decides how soon a frozen one (SIGSTOP) is noticed,
# and is generous because one slow answer from a busy replica on a loaded machine would take
# it out of rotation.
REPLICA_HEALTH_CHECK: dict[str, Any] = {
    "timeout": "1s",
    "interval": "0.5s",
    "no_traffic_interval": "0.5s",
    "unhealthy_threshold": 1,
    "healthy_threshold": 1,
    "grpc_health_check": {"service_name": SERVICE},
}
# Between a replica's death and its next failed check (up to half a second), Envoy still picks
# it for new streams; a stream that could not even connect is retried on another replica, so
# the client never sees the fallback 503 for it. Only failures before the replica saw the
# stream: a stream a replica began deciding is never decided twice. Without a backoff of its
# own a gRPC service's retry waits a jittered 0-1 s (Envoy's default base of 1 s), measured
# 0.08-0.5 s per such request; a refused connection to another host is worth retrying at once.
REPLICA_RETRY: dict[str, Any] = {
    "retry_on": "connect-failure,refused-stream",
    "num_retries": 2,
    "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.05s"},
    "retry_host_predicate": [{
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host."
                                  "previous_hosts.v3.PreviousHostsPredicate"}}],
    "host_selection_retry_max_attempts": 3,
}
# With one Envoy priority per replica (`set_replicas(prefer_first=True)`), a retry also leaves
# the priority it tried: the dead preferred replica is alone in its priority, and until its
# health check fails (up to half a second) the priority load still sends every pick there.
REPLICA_RETRY_PRIORITY: dict[str, Any] = {
    "name": "envoy.retry_priorities.previous_priorities",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.priority."
                              "previous_priorities.v3.PreviousPrioritiesConfig",
                     "update_frequency": 1},
}


def load_template(path: Path | str = TEMPLATE) -> dict[str, Any]:
    """Parse the standalone Envoy config that all rendered configs derive from."""
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def render(
    listen_port: int,
    admin_port: int,
    extproc_port: int | Sequence[int],
    members: dict[str, int],
    access_log_path: str | None = None,
    *,
    ext_proc: dict[str, Any] | None = None,
    template: Path | str = TEMPLATE,
    prefer_first: bool = False,
) -> dict[str, Any]:
    """Return the template config with new ports and member clusters.

    `extproc_port` is the ext_proc's port, or a list of its replicas' ports: with more than
    one, the ext_proc cluster round-robins streams over them and health-checks each
    (`REPLICA_HEALTH_CHECK`), and a stream that cannot connect to one is retried on another
    (`REPLICA_RETRY`); with one the config is the template's. With `prefer_first` the first
    replica takes every stream while it is healthy, and the others stand by (`set_replicas`).
    `members` maps cluster name (the routing header value, e.g. "judge.demo") to the port of
    that member on 127.0.0.1; it replaces the template's member clusters. `access_log_path`
    replaces /dev/stdout. `ext_proc` is shallow-merged into the ext_proc filter's typed_config
    (e.g. {"failure_mode_allow": False} for a fail-closed variant).
    """
    if not members:
        raise ValueError("members must name at least one cluster")
    cfg = load_template(template)
    _set_port(cfg["admin"]["address"], admin_port)

    listener = cfg["static_resources"]["listeners"][0]
    _set_port(listener["address"], listen_port)
    hcm = _named(listener["filter_chains"][0]["filters"], HCM_FILTER)["typed_config"]
    if access_log_path is not None:
        for log in hcm.get("access_log", []):
            log["typed_config"]["path"] = access_log_path
    ports = [extproc_port] if isinstance(extproc_port, int) else list(extproc_port)
    filter_config = _named(hcm["http_filters"], EXTPROC_FILTER)["typed_config"]
    if len(ports) > 1:
        filter_config["grpc_service"]["retry_policy"] = copy.deepcopy(REPLICA_RETRY)
        if prefer_first:
            filter_config["grpc_service"]["retry_policy"]["retry_priority"] = \
                copy.deepcopy(REPLICA_RETRY_PRIORITY)
    if ext_proc:
        filter_config.update(ext_proc)

    _set_member_routes(hcm["route_config"]["virtual_hosts"][0]["routes"], list(members))

    clusters = cfg["static_resources"]["clusters"]
    extproc = _named(clusters, EXTPROC_CLUSTER)
    set_replicas(extproc, ports, prefer_first=prefer_first)
    # Any template member cluster serves as the model for the new ones (same options).
    model = next(c for c in clusters if c["name"] != EXTPROC_CLUSTER)
    cfg["static_resources"]["clusters"] = [extproc] + [
        _member_cluster(model, name, port) for name, port in members.items()
    ]
    return cfg


def dump(cfg: dict[str, Any]) -> str:
    """Serialize a rendered config as YAML."""
    return yaml.safe_dump(cfg, sort_keys=False)


def write(path: Path | str, *args: Any, **kwargs: Any) -> Path:
    """Render (same arguments as `render`) and write the config to `path`; return the path."""
    path = Path(path)
    path.write_text(dump(render(*args, **kwargs)), encoding="utf-8")
    return path


def _set_member_routes(routes: list[dict[str, Any]], members: list[str]) -> None:
    """One metadata-matched route per member cluster, in place of the template's (the
    one-message mode routes on the service's dynamic metadata, not on a header)."""
    at = next(i for i, r in enumerate(routes) if r["name"].startswith(MEMBER_ROUTE_PREFIX))
    model = routes[at]
    routes[:] = [r for r in routes if not r["name"].startswith(MEMBER_ROUTE_PREFIX)]
    for offset, name in enumerate(members):
        route = copy.deepcopy(model)
        route["name"] = MEMBER_ROUTE_PREFIX + name
        route["match"]["dynamic_metadata"][0]["value"]["string_match"]["exact"] = name
        route["route"]["cluster"] = name
        routes.insert(at + offset, route)


def _member_cluster(model: dict[str, Any], name: str, port: int) -> dict[str, Any]:
    cluster = copy.deepcopy(model)
    cluster["name"] = name
    cluster["load_assignment"]["cluster_name"] = name
    _set_port(_endpoint_address(cluster), port)
    return cluster


def set_replicas(cluster: dict[str, Any], ports: Sequence[int], *,
                 prefer_first: bool = False) -> None:
    """Point the ext_proc's cluster at every replica: round robin, health-checked (gRPC
    health), no panic routing, when there are several. With ``prefer_first`` every stream goes
    to the first replica while it is healthy, to the next one while it is not (one Envoy
    priority per replica): the others stand by."""
    if not ports:
        raise ValueError("the ext_proc needs at least one port")
    groups = cluster["load_assignment"]["endpoints"]
    model = groups[0]["lb_endpoints"][0]
    endpoints = [copy.deepcopy(model) for _ in ports]
    for endpoint, port in zip(endpoints, ports):
        _set_port(endpoint["endpoint"]["address"], port)
    if prefer_first:
        groups[:] = [{"priority": rank, "lb_endpoints": [endpoint]}
                     for rank, endpoint in enumerate(endpoints)]
    else:
        groups[:] = [{**groups[0], "lb_endpoints": endpoints}]
    if len(ports) > 1:
        cluster["lb_policy"] = "ROUND_ROBIN"
        cluster["health_checks"] = [copy.deepcopy(REPLICA_HEALTH_CHECK)]
        # Below the default 50 % healthy, Envoy would "panic" and spread streams over every
        # replica, the NOT_SERVING ones too. With 0 it never does: with no healthy replica the
        # stream fails, and failure_mode_allow sends the request to the 503 + Retry-After route.
        # Envoy applies a host's return to health up to 1 s late (it merges such updates);
        # a replica that is back should take its share of streams at once.
        cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0.0},
                                       "update_merge_window": "0s"}


def _endpoint_address(cluster: dict[str, Any]) -> dict[str, Any]:
    endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    return endpoints[0]["endpoint"]["address"]


def _set_port(address: dict[str, Any], port: int) -> None:
    address["socket_address"]["port_value"] = int(port)


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise KeyError(f"{name!r} not found in Envoy config template")
