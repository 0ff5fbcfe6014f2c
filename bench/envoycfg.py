"""Envoy configs for the benchmarks, all rendered from the shipped envoy/envoy.yaml.

Two changes apply to every variant: the access log also records, per request, the wall-clock
start with microseconds and when Envoy began sending it to the member (``US_TX_BEG``), which is
how release latency is measured; and member clusters get large circuit breakers so thousands of
released requests queue at Envoy instead of failing (the shipped member clusters keep Envoy's
default of 1024, see docs/benchmarks.md). The "direct" variant drops the ext_proc filter and
sends every request to one member: the baseline the ext_proc path is compared with.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Sequence

from devstack import envoyconf
from devstack.envoyproc import EnvoyProcess

_TIMING_FIELDS = {
    # Wall clock (same clock as time.time()), microseconds.
    "start_s": "%START_TIME(%s.%6f)%",
    # From the downstream request's first byte to Envoy starting to send it upstream.
    "to_upstream_us": "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%",
    "duration_us": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
}
_MEMBER_LIMITS = {"thresholds": [{"priority": "DEFAULT", "max_connections": 1024,
                                  "max_pending_requests": 100000, "max_requests": 100000}]}


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(item for item in items if item.get("name") == name)


def _hcm(cfg: dict[str, Any]) -> dict[str, Any]:
    listener = cfg["static_resources"]["listeners"][0]
    return _named(listener["filter_chains"][0]["filters"], envoyconf.HCM_FILTER)["typed_config"]


def render(envoy: EnvoyProcess, extproc_port: int | Sequence[int], members: dict[str, int],
           direct_to: str | None = None, h2_members: tuple[str, ...] = (),
           prefer_first: bool = False) -> dict[str, Any]:
    """The bench config for ``envoy``'s ports; ``extproc_port`` is one port or several replicas'
    (round-robin and health checks, as the local stack renders them, or the first preferred),
    ``direct_to`` names the member of a direct run, ``h2_members`` the member clusters reached
    over HTTP/2 (the sink of the scale test)."""
    cfg = envoyconf.render(envoy.listen_port, envoy.admin_port, extproc_port, members,
                           str(envoy.access_log_path), prefer_first=prefer_first)
    hcm = _hcm(cfg)
    for log in hcm["access_log"]:
        log["typed_config"]["log_format"]["json_format"].update(_TIMING_FIELDS)
    for cluster in cfg["static_resources"]["clusters"]:
        if cluster["name"] != envoyconf.EXTPROC_CLUSTER:
            cluster["circuit_breakers"] = copy.deepcopy(_MEMBER_LIMITS)
        if cluster["name"] in h2_members:
            cluster["typed_extension_protocol_options"] = copy.deepcopy(
                _named(cfg["static_resources"]["clusters"], envoyconf.EXTPROC_CLUSTER)
                ["typed_extension_protocol_options"])
    if direct_to is not None:
        hcm["http_filters"] = [f for f in hcm["http_filters"]
                               if f["name"] not in (envoyconf.EXTPROC_FILTER,
                                                    envoyconf.BUFFER_FILTER)]
        # The fallback route (no routing header) becomes a plain route to the member, with the
        # member route's own options; nothing else changes. (The one-message fallback only
        # chooses the ext_proc's mode, so it goes with the ext_proc.)
        routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        routes[:] = [r for r in routes if r["name"] != "router_unavailable_one_message"]
        member_route = _named(routes, "member")
        fallback = _named(routes, "router_unavailable")
        fallback.pop("direct_response")
        fallback.pop("response_headers_to_add", None)
        fallback["route"] = {**member_route["route"], "cluster": direct_to}
        fallback["route"].pop("cluster_header")
    return cfg


def bench_envoy(workdir: Path, extproc_port: int | Sequence[int], members: dict[str, int],
                direct_to: str | None = None, h2_members: tuple[str, ...] = (),
                prefer_first: bool = False) -> EnvoyProcess:
    """An EnvoyProcess (not started) running the bench config in ``workdir``."""
    envoy = EnvoyProcess(extproc_port, members, workdir=workdir)
    cfg = render(envoy, extproc_port, members, direct_to, h2_members, prefer_first)
    envoy.config_path.write_text(envoyconf.dump(cfg), encoding="utf-8")
    return envoy


def sink_config(port: int, admin_port: int) -> dict[str, Any]:
    """A bare Envoy that answers every request with a small JSON 200 (HTTP/1.1 or h2c)."""
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network."
                    "http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "sink",
           "route_config": {"virtual_hosts": [{"name": "sink", "domains": ["*"], "routes": [{
               "match": {"prefix": "/"},
               "direct_response": {"status": 200, "body": {"inline_string": '{"ok":true}'}}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                     "port_value": admin_port}}},
            "static_resources": {"listeners": [{
                "name": "sink",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": envoyconf.HCM_FILTER, "typed_config": hcm}]}]}]}}


Config = dict[str, Any]


def _vhost(cfg: Config) -> Config:
    return _hcm(cfg)["route_config"]["virtual_hosts"][0]


def _ext_proc(cfg: Config) -> Config:
    return _named(_hcm(cfg)["http_filters"], envoyconf.EXTPROC_FILTER)["typed_config"]


def _no_buffer(cfg: Config) -> None:
    hcm = _hcm(cfg)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != envoyconf.BUFFER_FILTER]


def _member_routes_by_metadata_gone(cfg: Config) -> None:
    vhost = _vhost(cfg)
    vhost["routes"] = [r for r in vhost["routes"] if "dynamic_metadata" not in r["match"]]


#: Each edit takes one part out of a rendered config (in place): part 1c (bench/ablation.py).
EDITS: dict[str, Callable[[Config], None]] = {
    # the three informational answer headers formatted from dynamic metadata on every response
    "no-response-headers": lambda cfg: _vhost(cfg).pop("response_headers_to_add"),
    "no-retry-policy": lambda cfg: _vhost(cfg).pop("retry_policy"),
    "no-access-log": lambda cfg: _hcm(cfg).pop("access_log"),
    # (two-message mode: the headers message carries what the attributes would)
    "no-request-attributes": lambda cfg: _ext_proc(cfg).pop("request_attributes"),
    "no-metadata-options": lambda cfg: _ext_proc(cfg).pop("metadata_options"),
    "no-buffer-filter": _no_buffer,
    "no-metadata-routes": _member_routes_by_metadata_gone,
}
