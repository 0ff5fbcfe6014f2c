"""The standalone overlay's Envoy config balances over the ext_proc replicas and steers around
one that reports NOT_SERVING: deploy/overlays/standalone-envoy/envoy.yaml, run by a real Envoy
on loopback in front of the local stack's two real replicas.

Only what cannot run on a laptop is changed: the listener and the admin interface move to
loopback ports (the ops listener, on every interface, is left out), the access log goes to a
file, the ext_proc cluster's one host (the headless Service's name, which resolves to every
Ready pod) becomes the two replicas' loopback addresses, and the member clusters point at the
stack's members. The ext_proc cluster's type, balancing, health checks and panic threshold,
and the ext_proc filter with its retry policy, are the overlay's own.

NOT_SERVING comes from the service itself: the follower is cut off from the API server, its
membership Lease lapses, and it reports NOT_SERVING (it cannot admit). Envoy's per-host
counters for the ext_proc cluster (admin /clusters) show where each stream went.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from devstack import testkit
from devstack.envoyproc import EnvoyProcess
from devstack.procs import LOCALHOST, PROJECT_ROOT
from devstack.stack import LocalStack
from e2e_support import eventually, pools, wait_resident

OVERLAY = PROJECT_ROOT / "deploy" / "overlays" / "standalone-envoy" / "envoy.yaml"
EXTPROC = "modelpool-extproc"  # the overlay's ext_proc cluster
STACK_DOCS = pools(("ov", ["ov-a", "ov-b"], {"default": "ov-a"}))
STACK_OPTIONS = {"replicas": 2, "api_proxies": True}
REQUESTS = 24  # sequential; with two healthy hosts, each gets some (all on one: 2 ** -23)


def overlay_on_loopback(stack: LocalStack, listen_port: int, admin_port: int,
                        access_log: Path) -> dict[str, Any]:
    """The overlay's Envoy config with loopback addresses for the stack (module docstring)."""
    cfg = yaml.safe_load(OVERLAY.read_text(encoding="utf-8"))
    cfg["admin"]["address"]["socket_address"] = {"address": LOCALHOST, "port_value": admin_port}
    res = cfg["static_resources"]
    (listener,) = [lst for lst in res["listeners"] if lst["name"] == "modelpool"]
    res["listeners"] = [listener]
    listener["address"]["socket_address"] = {"address": LOCALHOST, "port_value": listen_port}
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    for log in hcm["access_log"]:
        log["name"] = "envoy.access_loggers.file"
        log["typed_config"] = {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(access_log), "log_format": log["typed_config"]["log_format"]}
    clusters = {c["name"]: c for c in res["clusters"]}
    ext = clusters[EXTPROC]
    (group,) = ext["load_assignment"]["endpoints"]
    (model,) = group["lb_endpoints"]
    group["lb_endpoints"] = [_at(model, replica.grpc_port) for replica in stack.replicas]
    member_model = next(c for name, c in clusters.items() if name not in (EXTPROC, "admin"))
    members = []
    for namespace, member in stack.members:
        cluster = copy.deepcopy(member_model)
        cluster["name"] = cluster["load_assignment"]["cluster_name"] = f"{member}.{namespace}"
        (endpoints,) = cluster["load_assignment"]["endpoints"]
        endpoints["lb_endpoints"] = [_at(endpoints["lb_endpoints"][0],
                                         stack.ports.members[member])]
        members.append(cluster)
    res["clusters"] = [ext, *members]
    # the one-message routes name each member (by dynamic metadata): the stack's, not the overlay's
    (host,) = hcm["route_config"]["virtual_hosts"]
    routes = host["routes"]
    template = next(r for r in routes if r["name"].startswith("member."))
    at = routes.index(template)
    named = template["route"]["cluster"]
    host["routes"] = [r for r in routes[:at] if not r["name"].startswith("member.")] + [
        json.loads(json.dumps(template).replace(named, f"{member}.{namespace}"))
        for namespace, member in stack.members] + [
        r for r in routes[at:] if not r["name"].startswith("member.")]
    return cfg


def _at(endpoint: dict[str, Any], port: int) -> dict[str, Any]:
    """``endpoint`` moved to LOCALHOST:``port``."""
    moved = copy.deepcopy(endpoint)
    moved["endpoint"]["address"]["socket_address"] = {"address": LOCALHOST, "port_value": port}
    return moved


def extproc_hosts(envoy: EnvoyProcess) -> dict[int, tuple[bool, int]]:
    """Per ext_proc replica port: (Envoy sends it new streams, streams sent so far)."""
    with urllib.request.urlopen(f"{envoy.admin_url}/clusters?format=json", timeout=5) as resp:
        statuses = json.loads(resp.read())["cluster_statuses"]
    hosts = next(c for c in statuses if c["name"] == EXTPROC)["host_statuses"]
    view = {}
    for host in hosts:
        flags = {k: v for k, v in host["health_status"].items() if k != "eds_health_status"}
        healthy = host["health_status"].get("eds_health_status") == "HEALTHY" and \
            not any(flags.values())
        stats = {s["name"]: int(s.get("value") or 0) for s in host.get("stats", [])}
        view[host["address"]["socket_address"]["port_value"]] = (healthy, stats["rq_total"])
    return view


def healthy_gauge(envoy: EnvoyProcess) -> float:
    """Envoy's count of healthy ext_proc replicas, as /stats/prometheus exports it."""
    with urllib.request.urlopen(f"{envoy.admin_url}/stats/prometheus", timeout=5) as resp:
        text = resp.read().decode()
    wanted = f'envoy_cluster_health_check_healthy{{envoy_cluster_name="{EXTPROC}"}}'
    (value,) = [line.split()[-1] for line in text.splitlines() if line.startswith(wanted + " ")]
    return float(value)


@pytest.fixture
def overlay_envoy(stack: LocalStack, tmp_path: Path) -> Any:
    """A real Envoy running the overlay's config in front of the stack's replicas."""
    envoy = EnvoyProcess.from_config(
        lambda listen, admin, log: overlay_on_loopback(stack, listen, admin, log),
        workdir=tmp_path / "overlay-envoy")
    envoy.start()
    try:
        yield envoy
    finally:
        envoy.stop()


async def _send(http: aiohttp.ClientSession, envoy: EnvoyProcess, model: str) -> None:
    """REQUESTS requests for ``model`` through ``envoy``, one after another; each served."""
    for _ in range(REQUESTS):
        reply = await testkit.chat(http, envoy.url, model, timeout=30)
        assert (reply.status, reply.served_by) == (200, model), reply.body


def _serving(replica: Any) -> bool:
    """What the replica's gRPC health says, as its serving gauge shows it."""
    return replica.metric("modelpool_extproc_serving") == 1


async def test_the_overlay_balances_over_replicas_and_steers_around_not_serving(
        stack: LocalStack, overlay_envoy: EnvoyProcess, http: aiohttp.ClientSession) -> None:
    await wait_resident(stack, "ov", "ov-a")
    ports = [r.grpc_port for r in stack.replicas]
    await eventually(lambda: {p: h for p, (h, _) in extproc_hosts(overlay_envoy).items()} ==
                     dict.fromkeys(ports, True), 20, "Envoy to see both replicas healthy")
    await _send(http, overlay_envoy, "ov-a")
    counts = {p: n for p, (_, n) in extproc_hosts(overlay_envoy).items()}
    assert all(counts[p] > 0 for p in ports), counts  # per stream, over both replicas
    assert sum(counts.values()) >= REQUESTS

    lease = "modelpool-extproc-leader"
    leases = stack.get(f"/apis/coordination.k8s.io/v1/namespaces/{stack.lease_namespace}"
                       f"/leases/{lease}")
    leader = leases["spec"]["holderIdentity"]
    follower = next(r for r in stack.replicas if r.name != leader)
    assert follower.proxy is not None
    follower.proxy.cut()
    try:
        # past duration - margin it cannot admit and says NOT_SERVING; Envoy's checks see it
        await eventually(lambda: not _serving(follower), 30, "the follower to say NOT_SERVING")
        await eventually(lambda: not extproc_hosts(overlay_envoy)[follower.grpc_port][0], 10,
                         "Envoy to stop sending the follower streams")
        assert healthy_gauge(overlay_envoy) == 1  # what operations.md says to look at
        before = extproc_hosts(overlay_envoy)
        await _send(http, overlay_envoy, "ov-a")  # every one served: none met its 503
        after = extproc_hosts(overlay_envoy)
        assert after[follower.grpc_port][1] == before[follower.grpc_port][1], (before, after)
        others = [p for p in ports if p != follower.grpc_port]
        assert sum(after[p][1] - before[p][1] for p in others) >= REQUESTS
    finally:
        follower.proxy.restore()
    await eventually(lambda: _serving(follower), 40, "the follower to serve again")
    await eventually(lambda: extproc_hosts(overlay_envoy)[follower.grpc_port][0], 10,
                     "Envoy to send the follower streams again")
    back = extproc_hosts(overlay_envoy)[follower.grpc_port][1]
    await _send(http, overlay_envoy, "ov-a")
    assert extproc_hosts(overlay_envoy)[follower.grpc_port][1] > back
