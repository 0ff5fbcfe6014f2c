"""envoy/envoy.yaml rendered for several ext_proc replicas: the cluster, validated by Envoy, and
Envoy's behaviour with it (real Envoy, stub ext_procs that serve gRPC health)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack import envoyconf, envoyproc
from devstack.procs import free_port
from devstack.testkit import eventually, posted
from devstack.fakemember import UpstreamHandle
from extproc.protocol.service import SERVICE
from test_envoy_config import validate

pytestmark = pytest.mark.envoy

REQUESTS = 12  # enough for round robin to show on every replica
HEALTH_SETTLE = 5.0  # Envoy checks every 0.5 s; room for a loaded machine


def extproc_cluster(cfg: dict) -> dict:
    """The rendered config's ext_proc cluster."""
    return next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "extproc")


def ext_proc_filter(cfg: dict) -> dict:
    """The rendered config's ext_proc filter settings."""
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return next(f for f in hcm["typed_config"]["http_filters"]
                if f["name"] == envoyconf.EXTPROC_FILTER)["typed_config"]


def ports_of(cluster: dict) -> list[int]:
    """The ports of a cluster's endpoints, in order (of priority, then within one)."""
    return [e["endpoint"]["address"]["socket_address"]["port_value"]
            for group in cluster["load_assignment"]["endpoints"] for e in group["lb_endpoints"]]


def test_several_replicas_are_round_robin_endpoints_with_grpc_health_checks() -> None:
    cfg = envoyconf.render(1111, 2222, [3331, 3332, 3333], {"x.ns": 4444})
    cluster = extproc_cluster(cfg)
    assert ports_of(cluster) == [3331, 3332, 3333]
    assert cluster["lb_policy"] == "ROUND_ROBIN"
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"] == {"service_name": SERVICE}
    assert check["unhealthy_threshold"] == check["healthy_threshold"] == 1
    assert check["interval"] == check["no_traffic_interval"] == "0.5s"
    assert cluster["common_lb_config"] == {"healthy_panic_threshold": {"value": 0.0},
                                           "update_merge_window": "0s"}
    retry = ext_proc_filter(cfg)["grpc_service"]["retry_policy"]
    assert retry["retry_on"] == "connect-failure,refused-stream"
    assert retry["retry_back_off"] == {"base_interval": "0.005s", "max_interval": "0.05s"}


def test_one_replica_keeps_the_template_cluster() -> None:
    one = envoyconf.render(1111, 2222, [3333], {"x.ns": 4444})
    assert one == envoyconf.render(1111, 2222, 3333, {"x.ns": 4444})
    cluster = extproc_cluster(one)
    template = extproc_cluster(envoyconf.load_template())
    assert ports_of(cluster) == [3333]
    assert {k: v for k, v in cluster.items() if k != "load_assignment"} == \
        {k: v for k, v in template.items() if k != "load_assignment"}
    assert ext_proc_filter(one) == ext_proc_filter(envoyconf.load_template())
    with pytest.raises(ValueError):
        envoyconf.render(1111, 2222, [], {"x.ns": 4444})


def test_preferring_the_first_replica_gives_each_replica_its_own_priority() -> None:
    cfg = envoyconf.render(1111, 2222, [3331, 3332, 3333], {"x.ns": 4444}, prefer_first=True)
    cluster = extproc_cluster(cfg)
    groups = cluster["load_assignment"]["endpoints"]
    assert [g["priority"] for g in groups] == [0, 1, 2]
    assert ports_of(cluster) == [3331, 3332, 3333]
    assert cluster["health_checks"] == extproc_cluster(
        envoyconf.render(1111, 2222, [3331, 3332, 3333], {"x.ns": 4444}))["health_checks"]
    retry = ext_proc_filter(cfg)["grpc_service"]["retry_policy"]
    assert retry["retry_priority"]["name"] == "envoy.retry_priorities.previous_priorities"


@pytest.mark.parametrize("prefer_first", [False, True], ids=["round-robin", "prefer-first"])
def test_rendered_replicas_config_validates(envoy_bin: Path, tmp_path: Path,
                                            prefer_first: bool) -> None:
    path = envoyconf.write(tmp_path / "envoy.yaml", 18180, 19190, [19002, 19003, 19004],
                           {"a.team": 18181}, str(tmp_path / "access.log"),
                           prefer_first=prefer_first)
    result = validate(envoy_bin, path)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_streams_spread_over_serving_replicas_only(
        envoy_factory, stub_extprocs, upstreams: dict[str, UpstreamHandle]) -> None:
    first, second = await stub_extprocs(), await stub_extprocs()
    envoy = envoy_factory([first.port, second.port], {"judge.demo": upstreams["judge"].port})
    await healthy(envoy, {first.port: True, second.port: True})

    await send(envoy, REQUESTS)
    assert first.streams > 0 and second.streams > 0
    assert first.streams + second.streams == REQUESTS

    # NOT_SERVING (what a replica that cannot renew its Lease reports): no new streams
    await second.set_serving(False)
    await healthy(envoy, {first.port: True, second.port: False})
    before = second.streams
    await send(envoy, REQUESTS)
    assert second.streams == before

    # SERVING again: streams come back
    await second.set_serving(True)
    await healthy(envoy, {first.port: True, second.port: True})
    await send(envoy, REQUESTS)
    assert second.streams > before
    entries = envoy.wait_access_log(3 * REQUESTS)
    assert {e["upstream_cluster"] for e in entries} == {"judge.demo"}


async def test_a_replica_gone_before_its_check_fails_costs_no_request(
        envoy_factory, stub_extprocs, upstreams: dict[str, UpstreamHandle]) -> None:
    first, second = await stub_extprocs(), await stub_extprocs()
    envoy = envoy_factory([first.port, second.port], {"judge.demo": upstreams["judge"].port})
    await healthy(envoy, {first.port: True, second.port: True})
    assert second.server is not None
    await second.server.stop(None)  # connections refused from now on; Envoy checks within 0.5 s
    await send(envoy, REQUESTS)  # round robin picks the gone one for every other stream
    assert first.streams == REQUESTS


async def test_the_preferred_replica_takes_every_stream_and_the_next_one_takes_over(
        envoy_factory, stub_extprocs, upstreams: dict[str, UpstreamHandle]) -> None:
    stubs = [await stub_extprocs() for _ in range(3)]
    first, second, third = stubs
    envoy = envoy_factory([s.port for s in stubs], {"judge.demo": upstreams["judge"].port},
                          prefer_first=True)
    await healthy(envoy, {s.port: True for s in stubs})
    await send(envoy, REQUESTS)
    assert [s.streams for s in stubs] == [REQUESTS, 0, 0]

    # NOT_SERVING: the next priority takes every new stream; SERVING again: back to the first
    await first.set_serving(False)
    await healthy(envoy, {first.port: False, second.port: True, third.port: True})
    await send(envoy, REQUESTS)
    assert [s.streams for s in stubs] == [REQUESTS, REQUESTS, 0]
    await first.set_serving(True)
    await healthy(envoy, {s.port: True for s in stubs})
    await send(envoy, REQUESTS)
    assert [s.streams for s in stubs] == [2 * REQUESTS, REQUESTS, 0]

    # Gone before its check fails: the retry leaves its priority, no request is lost
    assert first.server is not None
    await first.server.stop(None)
    await send(envoy, REQUESTS)
    assert second.streams + third.streams == 2 * REQUESTS and first.streams == 2 * REQUESTS


async def test_a_retry_leaves_the_preferred_replica_while_envoy_still_counts_it_healthy(
        stub_extprocs, upstreams: dict[str, UpstreamHandle], tmp_path: Path) -> None:
    # The first replica's gRPC health answers SERVING from a port of its own while its ext_proc
    # port refuses connections, so Envoy keeps it healthy and first in line (as in the half
    # second before a dead replica's check fails): every stream's first try fails to connect,
    # and only a retry that leaves the first priority reaches the second replica.
    health_only, second = await stub_extprocs(), await stub_extprocs()
    refusing = free_port()

    def build(listen_port: int, admin_port: int, access_log: Path) -> dict:
        cfg = envoyconf.render(listen_port, admin_port, [refusing, second.port],
                               {"judge.demo": upstreams["judge"].port}, str(access_log),
                               prefer_first=True)
        first = extproc_cluster(cfg)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        first["endpoint"]["health_check_config"] = {"port_value": health_only.port}
        return cfg

    envoy = envoyproc.EnvoyProcess.from_config(build, workdir=tmp_path / "envoy").start()
    try:
        await healthy(envoy, {refusing: True, second.port: True})
        await send(envoy, REQUESTS)
        assert second.streams == REQUESTS and health_only.streams == 0
        assert envoy.extproc_health() == {refusing: True, second.port: True}
    finally:
        envoy.stop()


async def send(envoy: envoyproc.EnvoyProcess, count: int) -> None:
    """``count`` requests for judge, one after another, each routed to it."""
    for _ in range(count):
        async with posted(f"{envoy.url}/v1/chat/completions",
                          json={"model": "judge", "messages": []}) as resp:
            assert resp.status == 200 and resp.headers["x-served-by"] == "judge"


async def test_no_serving_replica_is_the_router_unavailable_503(
        envoy_factory, stub_extprocs, upstreams: dict[str, UpstreamHandle]) -> None:
    stubs = [await stub_extprocs(), await stub_extprocs()]
    envoy = envoy_factory([s.port for s in stubs], {"judge.demo": upstreams["judge"].port})
    for stub in stubs:
        await stub.set_serving(False)
    await healthy(envoy, {s.port: False for s in stubs})
    async with posted(f"{envoy.url}/v1/chat/completions", json={"model": "judge"}) as resp:
        assert resp.status == 503 and resp.headers["retry-after"] == "5"
        assert (await resp.json())["error"]["code"] == "router_unavailable"
    assert upstreams["judge"].stats.served == 0 and sum(s.streams for s in stubs) == 0


async def healthy(envoy: envoyproc.EnvoyProcess, expected: dict[int, bool]) -> None:
    """Wait until Envoy's health view of the ext_proc replicas is ``expected``."""
    await eventually(lambda: envoy.extproc_health() == expected, HEALTH_SETTLE,
                     f"Envoy to see the replicas as {expected}", blocking=True, interval=0.1)
