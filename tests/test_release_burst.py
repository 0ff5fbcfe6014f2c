"""More than 1024 held requests released to one member at once, through the standalone Envoy
config (envoy/envoy.yaml): none may overflow a circuit breaker as a 503.

Envoy's default per-cluster limits (1024 connections, pending and active requests) would turn
part of such a release into 503s; the config raises them on the member clusters (and the
chart's BackendTrafficPolicy does the same under Envoy Gateway). A control run with the member
breaker lowered shows the test sees overflow when it happens. Load is bounded: RELEASED
requests on loopback, each with a timeout.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import aiohttp
import pytest
import yaml

from devstack.envoyconf import TEMPLATE, load_template
from extproc.app import Service
from extproc.policy.model import PoolSpec
from extproc.settings import Settings
from test_parking import KEY, FakeCluster, _held

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(300)]
RELEASED = 1100  # above the 1024 default


class GatedCluster(FakeCluster):
    """A FakeCluster whose loads finish only when ``gate`` opens."""

    gate: asyncio.Event

    async def scale(self, key, member, replicas) -> None:
        """Load only once the gate opens (so every request is held first)."""
        if replicas:
            self._see(key, member, "Creating", 1, 1)
            await self.gate.wait()
            self._see(key, member, "Ready", 1, 1)
        else:
            await super().scale(key, member, replicas)


async def _release(upstreams, envoy_factory, template: Path) -> collections.Counter:
    spec = PoolSpec(KEY, ("judge", "coder"), swap_budget=240.0)
    cluster = GatedCluster([spec])
    cluster.gate = asyncio.Event()
    # more held at once than the default bound: the operator's choice, made here
    service = Service(Settings(listen="127.0.0.1:0", metrics_listen="", max_held=0), cluster)
    await service.start()
    try:
        envoy = envoy_factory(service.grpc_port, {f"{n}.demo": h.port
                                                  for n, h in upstreams.items()},
                              template=template)
        await cluster.synced.wait()
        timeout = aiohttp.ClientTimeout(total=200)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=timeout) as session:
            async def one() -> int:
                async with session.post(f"{envoy.url}/v1/chat/completions", json={
                        "model": "coder", "messages": [{"role": "user", "content": "hi"}]}) \
                        as resp:
                    await resp.read()
                    return resp.status

            requests = [asyncio.ensure_future(one()) for _ in range(RELEASED)]
            for _ in range(1200):  # every request held before the release (bounded wait)
                if _held() == RELEASED or all(r.done() for r in requests):
                    break
                await asyncio.sleep(0.1)
            assert _held() == RELEASED, f"only {_held()} of {RELEASED} held"
            cluster.gate.set()
            return collections.Counter(await asyncio.gather(*requests))
    finally:
        await service.stop()


async def test_a_release_above_1024_gets_no_503(upstreams, envoy_factory) -> None:
    statuses = await _release(upstreams, envoy_factory, TEMPLATE)
    assert statuses == {200: RELEASED}
    assert upstreams["coder"].stats.inference >= RELEASED


async def test_control_a_low_member_breaker_overflows(upstreams, envoy_factory,
                                                      tmp_path: Path) -> None:
    config = load_template()
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"].endswith(".demo"):
            cluster["circuit_breakers"] = {"thresholds": [{
                "priority": "DEFAULT", "max_connections": 256, "max_pending_requests": 16,
                "max_requests": 256}]}
    template = tmp_path / "low-breaker.yaml"
    template.write_text(yaml.safe_dump(config))
    statuses = await _release(upstreams, envoy_factory, template)
    assert statuses[503] > 0 and statuses[200] + statuses[503] == RELEASED
