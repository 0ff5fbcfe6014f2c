"""Envoy Gateway's xDS (egctl's config dump) as a static bootstrap for our Envoy binary.

Envoy Gateway serves its listeners, routes, clusters and endpoints over ADS from its
controller; there is no controller here, so the dumped resources become `static_resources`
of one bootstrap. Only what ties them to a cluster is rewritten, each in one place below:

- the Gateway listener's address (0.0.0.0 and Envoy Gateway's port, the Gateway's port + 10000
  when below 1024) becomes 127.0.0.1 and the test's port, and its access logs go to the test's
  file instead of stdout. Envoy Gateway's readiness listener (/ready for the pod's probe) is
  left out with the rest of its control-plane plumbing (below);
- each HTTP connection manager's `rds` (fetch the route table by name over ADS) becomes the
  dumped RouteConfiguration of that name, inline;
- EDS clusters become STATIC with the dumped endpoints inline, and every endpoint address (a
  Service ClusterIP:port from the translation input) becomes 127.0.0.1 and the port of the
  test process standing in for that Service. An endpoint with no stand-in is an error: nothing
  is silently left pointing at an address that does not exist here;
- admin on 127.0.0.1. Envoy Gateway's own bootstrap (its xDS cluster, stats and readiness
  listeners) serves the control plane, not the data path, and is left out.

Everything else (HTTP filters, the ext_proc filter and its per-route enablement, routes,
timeouts, direct responses, early header mutation, circuit breakers) stays as the translator
wrote it: that is what the tests exercise.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

from devstack.procs import LOCALHOST

HCM_FILTER = "envoy.filters.network.http_connection_manager"
FILE_ACCESS_LOG = "envoy.access_loggers.file"
DUMP_TYPE = "type.googleapis.com/envoy.admin.v3."


def dumped(config_dump: dict[str, Any], kind: str, listing: str,
           field: str) -> list[dict[str, Any]]:
    """The resources of one section of a config dump, without their packed Any's `@type`.

    For example ("Clusters", "dynamicActiveClusters", "cluster"): every dynamic cluster.
    """
    sections = [c for c in config_dump["configs"] if c["@type"] == f"{DUMP_TYPE}{kind}ConfigDump"]
    found = []
    for section in sections:
        for entry in section.get(listing) or []:
            resource = entry.get(field) or entry.get("activeState", {}).get(field)
            if resource is not None:
                found.append({k: v for k, v in copy.deepcopy(resource).items() if k != "@type"})
    return found


def static_bootstrap(config_dump: dict[str, Any], listener_name: str, listen_port: int,
                     admin_port: int, access_log: str,
                     stand_ins: dict[tuple[str, int], int]) -> dict[str, Any]:
    """A bootstrap running the dump's data path on loopback.

    `listener_name` is the Gateway listener's xDS name (`<namespace>/<gateway>/<listener>`);
    `stand_ins` maps an endpoint address of the dump (ClusterIP, port) to the loopback port of
    the process that plays that backend.
    """
    routes = {r["name"]: r for r in dumped(config_dump, "Routes", "dynamicRouteConfigs",
                                           "routeConfig")}
    endpoints = {e["clusterName"]: e for e in dumped(config_dump, "Endpoints",
                                                     "dynamicEndpointConfigs", "endpointConfig")}
    listener = gateway_listener(config_dump, listener_name)
    listener["address"] = _loopback(listen_port)
    for hcm in connection_managers(listener):
        hcm["routeConfig"] = routes[hcm.pop("rds")["routeConfigName"]]
    for log in _file_access_logs(listener):
        log["typedConfig"]["path"] = access_log
    clusters = dumped(config_dump, "Clusters", "dynamicActiveClusters", "cluster")
    for cluster in clusters:
        if cluster.get("type") == "EDS":
            service = cluster.pop("edsClusterConfig").get("serviceName", cluster["name"])
            cluster["type"] = "STATIC"
            cluster["loadAssignment"] = _on_loopback(endpoints[service], stand_ins)
    return {
        "admin": {"address": _loopback(admin_port)},
        "staticResources": {"listeners": [listener], "clusters": clusters},
    }


def gateway_listener(config_dump: dict[str, Any], listener_name: str) -> dict[str, Any]:
    """The dumped listener of that xDS name (a copy)."""
    found = [listener for listener in dumped(config_dump, "Listeners", "dynamicListeners",
                                             "listener") if listener["name"] == listener_name]
    if len(found) != 1:
        raise ValueError(f"expected one listener {listener_name!r}, got {len(found)}")
    return found[0]


def connection_managers(listener: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The typed configs of the listener's HTTP connection managers, in every filter chain."""
    chains = list(listener.get("filterChains") or [])
    if "defaultFilterChain" in listener:
        chains.append(listener["defaultFilterChain"])
    for chain in chains:
        for network_filter in chain.get("filters") or []:
            if network_filter["name"] == HCM_FILTER:
                yield network_filter["typedConfig"]


def _file_access_logs(listener: dict[str, Any]) -> Iterator[dict[str, Any]]:
    logs = list(listener.get("accessLog") or [])
    for hcm in connection_managers(listener):
        logs += hcm.get("accessLog") or []
    yield from (log for log in logs if log["name"] == FILE_ACCESS_LOG)


def endpoint_address(lb_endpoint: dict[str, Any]) -> tuple[str, int]:
    """(address, port) of one endpoint of a ClusterLoadAssignment."""
    socket = lb_endpoint["endpoint"]["address"]["socketAddress"]
    return socket["address"], int(socket["portValue"])


def _on_loopback(assignment: dict[str, Any],
                 stand_ins: dict[tuple[str, int], int]) -> dict[str, Any]:
    for locality in assignment.get("endpoints") or []:
        for lb_endpoint in locality.get("lbEndpoints") or []:
            where = endpoint_address(lb_endpoint)
            if where not in stand_ins:
                raise KeyError(f"cluster {assignment['clusterName']}: no stand-in for "
                               f"endpoint {where[0]}:{where[1]}")
            lb_endpoint["endpoint"]["address"] = _loopback(stand_ins[where])
    return assignment


def _loopback(port: int) -> dict[str, Any]:
    return {"socketAddress": {"address": LOCALHOST, "portValue": port}}
