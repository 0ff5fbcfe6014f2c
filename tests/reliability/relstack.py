"""The reliability tests' static-pool stack and the probes they share."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack import envoyproc
from devstack.testkit import DEMO_POOLS
from devstack.fakemember import UpstreamHandle
from extproc import metrics
from extproc.app import Service
from extproc.settings import Settings

POOLS = DEMO_POOLS
BODY_LIMIT = 1024 * 1024


@dataclass
class Stack:
    """What a reliability test talks to and inspects."""

    service: Service
    envoy: envoyproc.EnvoyProcess
    upstreams: dict[str, UpstreamHandle]

    def served(self) -> dict[str, int]:
        """Requests each member has seen so far."""
        return {name: h.stats.served for name, h in self.upstreams.items()}


def settings_for(pools: Path, **changes: object) -> Settings:
    """Loopback settings for an in-process service on free ports."""
    defaults: dict[str, object] = {"listen": "127.0.0.1:0", "metrics_listen": "",
                                   "pools_file": str(pools), "max_body_bytes": BODY_LIMIT}
    return Settings(**{**defaults, **changes})  # type: ignore[arg-type]


async def health_status(port: int, service: str = "") -> int:
    """The grpc.health.v1 status the service reports on 127.0.0.1:port."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5)
    return reply.status


SERVING = health_pb2.HealthCheckResponse.SERVING


def streams_in_flight() -> float:
    """The service's open ext_proc stream gauge, as a scrape reads it."""
    return metrics.REGISTRY.get_sample_value("modelpool_extproc_streams_in_flight") or 0.0


async def settle(condition, timeout: float = 10.0) -> bool:
    """Poll ``condition()`` until true or ``timeout`` (a liveness bound); return its last value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() >= deadline:
            return bool(condition())
        await asyncio.sleep(0.05)
    return True


@contextlib.asynccontextmanager
async def serving(workdir: Path, **changes: object) -> AsyncIterator[Service]:
    """The service alone (no Envoy), static pools, on a free loopback port, synced."""
    pools = workdir / "pools.yaml"
    pools.write_text(POOLS)
    svc = Service(settings_for(pools, **changes))
    await svc.start()
    assert await settle(lambda: svc.platform.synced.is_set())
    try:
        yield svc
    finally:
        await svc.stop()
