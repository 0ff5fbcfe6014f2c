"""Envoy Gateway's translation of deploy/overlays/inference-pool, completed as its
InferencePool extension completes it, to run in front of the local stack.

Envoy Gateway v1.9.1 serves an InferencePool backend only through an extension server (its
``extensionManager.backendResources``): by itself, egctl refuses the InferencePool object (no
such kind in its scheme), marks the HTTPRoute's backendRef ``InvalidKind`` and answers the
route with a direct 500 (test_envoy_gateway_inference_pool.py pins that). Envoy AI Gateway is
that extension: its xDS hook adds the pool's ext_proc filter (bodies FULL_DUPLEX_STREAMED
both ways, every phase sent, 5 s message timeout, failure mode closed), a cluster for the
picker and an ORIGINAL_DST cluster for the pool's pods, and points the route at the latter.
egctl runs no extension, so that part is applied here to egctl's output
(``devstack/picker_envoy.py`` holds the pieces); the Gateway's listener, its connection
manager's options, access log and route match stay exactly as Envoy Gateway wrote them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from devstack.picker_envoy import (GATEWAY_MESSAGE_TIMEOUT, POOL_ROUTE, ext_proc_filter,
                                   pool_clusters)
from devstack.envoyproc import EnvoyProcess
from tests.deploy.conftest import render_path
from tests.gateway.bootstrap import connection_managers, dumped, static_bootstrap
from tests.gateway.conftest import GATEWAY_LISTENER, require_egctl
from tests.gateway.egctl import ExamplePool, Translation, translate, translation_input

OVERLAY = "deploy/overlays/inference-pool"
ROUTER = "envoy.filters.http.router"


@functools.cache
def translated(workdir: Path) -> Translation:
    """egctl's translation of the overlay, without the InferencePool egctl cannot read."""
    require_egctl()
    objects = [o for o in render_path(OVERLAY) if o["kind"] != "InferencePool"]
    return translate(translation_input(objects, ExamplePool.load()), workdir)


def pool_routes(config_dump: dict[str, Any]) -> list[dict[str, Any]]:
    """The routes Envoy Gateway made of the pool's HTTPRoute (by their resource metadata)."""
    return [route for config in dumped(config_dump, "Routes", "dynamicRouteConfigs",
                                       "routeConfig")
            for host in config.get("virtualHosts") or [] for route in host.get("routes") or []
            if {"kind": "HTTPRoute", "name": ExamplePool.load().name,
                "namespace": ExamplePool.load().namespace}
            in route.get("metadata", {}).get("filterMetadata", {}).get("envoy-gateway", {})
            .get("resources", [])]


#: How the extension dials a pool's picker: TLS, its certificate not verified.
PICKER_TLS = {"name": "envoy.transport_sockets.tls", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
    "common_tls_context": {"validation_context": {}}}}


def with_extension(bootstrap: dict[str, Any], extproc_port: int, tls: bool = False,
                   message_timeout: str = GATEWAY_MESSAGE_TIMEOUT) -> dict[str, Any]:
    """The extension's part on a static bootstrap of the translation (changed in place);
    ``tls``: dial the picker as the extension does (the ext_proc must serve TLS)."""
    for listener in bootstrap["staticResources"]["listeners"]:
        for hcm in connection_managers(listener):
            filters = hcm["httpFilters"]
            at = next(i for i, f in enumerate(filters) if f["name"] == ROUTER)
            filters.insert(at, ext_proc_filter("FULL_DUPLEX_STREAMED", message_timeout))
            for host in hcm["routeConfig"]["virtualHosts"]:
                for route in host["routes"]:
                    if route.get("directResponse", {}).get("status") == 500 and \
                            route["name"].startswith("httproute/"):
                        del route["directResponse"]  # the unresolved InferencePool backend
                        route["route"] = dict(POOL_ROUTE)
    clusters = pool_clusters(extproc_port)
    if tls:
        clusters[0]["transport_socket"] = PICKER_TLS  # the picker's
    bootstrap["staticResources"]["clusters"] += clusters
    return bootstrap


def inference_gateway(stack: Any, tls: bool = False,
                      message_timeout: str = GATEWAY_MESSAGE_TIMEOUT) -> EnvoyProcess:
    """For LocalStack(gateway=...): the completed translation on the stack's Envoy ports
    (``message_timeout``: the picker filter's; 5 s in Envoy AI Gateway before v0.4.0)."""
    (dump,) = translated(stack.workdir.parent / "egctl-inference-pool").xds.values()
    grpc = stack.replicas[0].grpc_port
    return EnvoyProcess.from_config(
        lambda listen, admin, log: with_extension(
            static_bootstrap(dump, GATEWAY_LISTENER, listen, admin, str(log), {}), grpc, tls,
            message_timeout),
        workdir=stack.workdir / "envoy", listen_port=stack.ports.envoy,
        admin_port=stack.ports.envoy_admin)
