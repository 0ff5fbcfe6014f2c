"""An Envoy in front of the service as an InferencePool's gateway would be: it asks the
endpoint picker, then sends the request to the ``ip:port`` the picker named.

What a gateway builds for an InferencePool backend, written out by hand: one ext_proc filter
on the pool's route (its body mode chosen per test: BUFFERED, STREAMED or
FULL_DUPLEX_STREAMED) and an ORIGINAL_DST cluster that connects to the address in the
``x-gateway-destination-endpoint`` header, which is how the inference extension's own
reference Envoy configuration consumes the picker's answer. In FULL_DUPLEX_STREAMED mode it is
what Envoy AI Gateway (the extension through which Envoy Gateway serves InferencePools; Envoy
Gateway alone does not) renders for a pool's picker: headers, bodies and trailers both ways,
bodies full duplex, a 300 s message timeout, no failure mode allow.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from devstack.envoyconf import REPLICA_RETRY, set_replicas
from devstack.procs import LOCALHOST
from extproc.protocol.picker import (DESTINATION, LB_NAMESPACE, SERVED_KEY, SUBSET_KEY,
                                     SUBSET_NAMESPACE)

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
# What Envoy AI Gateway (the InferencePool extension of Envoy Gateway) renders for a pool's
# picker: a 300 s message timeout (5 s before v0.4.0) and no max_message_timeout. In
# FULL_DUPLEX_STREAMED mode Envoy does not time a held request out by it (tested:
# e2e/test_e2e_endpoint_picker.py); in BUFFERED mode a hold longer than it is answered 504
# (measured with 5 s), so a pool's swapBudget must stay below it.
GATEWAY_MESSAGE_TIMEOUT = "300s"
FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HCM = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
       "HttpConnectionManager")


def picker_config(listen_port: int, admin_port: int, access_log: str,
                  extproc_port: int | Sequence[int],
                  body_mode: str, subset: list[str] | None = None,
                  message_timeout: str = GATEWAY_MESSAGE_TIMEOUT,
                  served: str | None = None) -> dict[str, Any]:
    """The bootstrap: listener -> ext_proc (``body_mode`` both ways) -> the picked pod.

    ``subset``: the proxy's subset hint, set as request metadata before the ext_proc filter
    (the set_metadata filter), as a gateway that subsets the pool would send it.
    ``served``: report the endpoint that served each response as the protocol's gateways do
    (``envoy.lb`` ``x-gateway-destination-endpoint-served`` on the response headers message),
    with this value (an Envoy format string such as ``%UPSTREAM_REMOTE_ADDRESS%``).
    """
    route = dict(POOL_ROUTE)
    reporting = [] if served is None else [_served_filter()]
    extproc = ext_proc_filter(body_mode, message_timeout)
    if not isinstance(extproc_port, int) and len(extproc_port) > 1:
        # a stream that could not reach a replica (killed, not yet seen unhealthy) tries another
        extproc["typed_config"]["grpc_service"]["retry_policy"] = copy.deepcopy(REPLICA_RETRY)
    if served is not None:
        extproc["typed_config"]["metadata_options"]["forwarding_namespaces"]["untyped"].append(
            LB_NAMESPACE)
    hcm = {"@type": HCM, "stat_prefix": "picker",
           "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
               "@type": FILE_LOG, "path": access_log}}],
           "route_config": {"virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [{
               "match": {"prefix": "/"}, "route": route,
               **({} if served is None else {"response_headers_to_add": [{"header": {
                   "key": SERVED_HEADER, "value": served}}]})}]}]},
           "http_filters": ([] if subset is None else [_subset_filter(subset)]) + [
               extproc, *reporting,
               {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]}
    return {
        "admin": {"address": _address(admin_port)},
        "static_resources": {
            "listeners": [{"name": "gateway", "address": _address(listen_port),
                           "filter_chains": [{"filters": [{
                               "name": "envoy.filters.network.http_connection_manager",
                               "typed_config": hcm}]}]}],
            "clusters": pool_clusters(extproc_port)},
    }


#: The response header that carries the served endpoint from the route to the metadata filter
SERVED_HEADER = "x-modelpool-test-served"
HEADER_TO_METADATA = ("type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3."
                      "Config")


def _served_filter() -> dict[str, Any]:
    # The route adds the served endpoint as a response header before the encoder filters run;
    # this filter (after ext_proc in the list, so before it on the response) moves it into
    # the metadata ext_proc forwards, as a gateway reporting it natively would.
    return {"name": "envoy.filters.http.header_to_metadata", "typed_config": {
        "@type": HEADER_TO_METADATA, "response_rules": [{
            "header": SERVED_HEADER, "remove": True, "on_header_present": {
                "metadata_namespace": LB_NAMESPACE, "key": SERVED_KEY, "type": "STRING"}}]}}


#: The route action to the pool: whichever pod the picker named; no route timeout.
POOL_ROUTE = {"cluster": "pool", "timeout": "0s", "idle_timeout": "600s"}


def ext_proc_filter(body_mode: str,
                    message_timeout: str = GATEWAY_MESSAGE_TIMEOUT) -> dict[str, Any]:
    """The pool's ext_proc filter: every phase sent, bodies in ``body_mode`` both ways."""
    duplex = body_mode == "FULL_DUPLEX_STREAMED"
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "600s"},
        "failure_mode_allow": False,
        "message_timeout": message_timeout,
        "processing_mode": {
            "request_header_mode": "SEND", "request_body_mode": body_mode,
            "request_trailer_mode": "SEND" if duplex else "SKIP",
            "response_header_mode": "SEND", "response_body_mode": body_mode,
            "response_trailer_mode": "SEND" if duplex else "SKIP"},
        "metadata_options": {"forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE]}}}}


def pool_clusters(extproc_ports: int | Sequence[int]) -> list[dict[str, Any]]:
    """The picker (HTTP/2 to the ext_proc replicas: with several, round robin over the ones
    whose gRPC health says SERVING) and the pool (the address the picker named)."""
    ports = [extproc_ports] if isinstance(extproc_ports, int) else list(extproc_ports)
    picker = {"name": "picker", "type": "STATIC", "connect_timeout": "1s",
              "typed_extension_protocol_options": {
                  "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                      "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                               "HttpProtocolOptions",
                      "explicit_http_config": {"http2_protocol_options": {}}}},
              "load_assignment": {"cluster_name": "picker", "endpoints": [{"lb_endpoints": [
                  {"endpoint": {"address": _address(ports[0])}}]}]}}
    set_replicas(picker, ports)
    return [
        picker,
        {"name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
         "connect_timeout": "2s",
         "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION}},
    ]


def _subset_filter(subset: list[str]) -> dict[str, Any]:
    return {"name": "envoy.filters.http.set_metadata", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
        "metadata": [{"metadata_namespace": SUBSET_NAMESPACE,
                      "value": {SUBSET_KEY: subset}}]}}


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": LOCALHOST, "port_value": port}}
