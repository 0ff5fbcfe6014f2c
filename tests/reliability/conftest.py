"""Fixtures: a module-scoped static-pool stack (fake members, in-process service, real Envoy),
and the service alone for tests that speak ext_proc to it directly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest
import pytest_asyncio
from relstack import POOLS, Stack, serving, settings_for

from devstack import envoyproc
from devstack.testkit import finish_within
from devstack.fakemember import start_upstream
from extproc.app import Service


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(envoy_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """Service + Envoy + members judge and coder, shared by one module's tests."""
    workdir = tmp_path_factory.mktemp("reliability")
    pools = workdir / "pools.yaml"
    pools.write_text(POOLS)
    upstreams = {name: await start_upstream(name, token_delay_ms=1) for name in ("judge", "coder")}
    service = Service(settings_for(pools))
    await service.start()
    envoy = envoyproc.EnvoyProcess(service.grpc_port, {f"{n}.demo": h.port
                                                   for n, h in upstreams.items()},
                               workdir=workdir / "envoy")
    try:
        await asyncio.to_thread(envoy.start)
        yield Stack(service, envoy, upstreams)
    finally:
        envoy.stop()
        await finish_within(service.stop(), service.settings.shutdown_grace + 15,
                            "the service to drain and stop")
        for handle in upstreams.values():
            await finish_within(handle.stop(), 15, f"fake member {handle.name} to stop")


@pytest_asyncio.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    """The service alone (no Envoy), static pools, on a free loopback port."""
    async with serving(tmp_path) as svc:
        yield svc
