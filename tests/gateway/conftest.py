"""Fixtures: Envoy Gateway's translation of the overlay, run by our Envoy in front of the service.

The translation needs egctl (`make egctl`, which `make test` runs). Without it the tests skip
with the reason, except in CI (`CI=true`), where a skip would hide that the overlay was never
translated: there they fail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

import pytest

from devstack import envoyproc
from devstack.testkit import stop_front_to_back
from devstack.fakemember import UpstreamHandle, start_upstream
from extproc.app import Service
from extproc.settings import Settings
from tests.deploy.conftest import render_path
from tests.gateway.bootstrap import dumped, endpoint_address, static_bootstrap
from tests.gateway.egctl import (EXTPROC_SERVICE, MEMBER_PORT, ExamplePool, Translation,
                                 egctl_binary, translate, translation_input)

OVERLAY = "deploy/overlays/envoy-gateway"
EXTPROC_PORT = 9002  # the Service port the EnvoyExtensionPolicy's backendRef names
GATEWAY_LISTENER = "llm/modelpool/http"  # Envoy Gateway's name for the Gateway's listener


def require_egctl() -> None:
    """Skip (fail in CI) when egctl is not built."""
    try:
        egctl_binary()
    except FileNotFoundError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc}; CI must translate the overlay, not skip it")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def pool() -> ExamplePool:
    """The example pool of deploy/examples/."""
    return ExamplePool.load()


@dataclass
class GatewayRun:
    """The translation, and the input's Service addresses it refers to."""

    translation: Translation
    backends: dict[tuple[str, int], tuple[str, int]]

    @property
    def config_dump(self) -> dict:
        """The xDS of the overlay's one Gateway."""
        (dump,) = self.translation.xds.values()
        return dump

    def cluster_backends(self) -> dict[str, set[str]]:
        """xDS cluster name -> the input Services its endpoints stand for."""
        return {assignment["clusterName"]: {self.backends[endpoint_address(lb)][0]
                                            for locality in assignment["endpoints"]
                                            for lb in locality["lbEndpoints"]}
                for assignment in dumped(self.config_dump, "Endpoints",
                                         "dynamicEndpointConfigs", "endpointConfig")}

    def cluster_of(self, service: str) -> str:
        """The one xDS cluster that sends to `service`."""
        (name,) = [n for n, services in self.cluster_backends().items() if services == {service}]
        return name


@pytest.fixture(scope="session")
def gateway_run(pool: ExamplePool, tmp_path_factory: pytest.TempPathFactory) -> GatewayRun:
    """egctl's translation of the overlay plus the example pool's member Services."""
    require_egctl()
    given = translation_input(render_path(OVERLAY), pool)
    return GatewayRun(translate(given, tmp_path_factory.mktemp("egctl")), given.backends)


def run_translated(gateway_run: GatewayRun, extproc_port: int, member_ports: dict[str, int],
                   workdir: Path) -> envoyproc.EnvoyProcess:
    """Our Envoy on the translated config, its backends played by these loopback ports."""
    loopback = {(EXTPROC_SERVICE, EXTPROC_PORT): extproc_port}
    loopback |= {(name, MEMBER_PORT): port for name, port in member_ports.items()}
    stand_ins = {address: loopback[backend]
                 for address, backend in gateway_run.backends.items() if backend in loopback}
    return envoyproc.EnvoyProcess.from_config(
        lambda listen, admin, log: static_bootstrap(
            gateway_run.config_dump, GATEWAY_LISTENER, listen, admin, str(log), stand_ins),
        workdir=workdir).start()


@dataclass
class GatewayStack:
    """Our Envoy running the translated config, the service, and one fake upstream per member."""

    service: Service
    members: dict[str, UpstreamHandle] = field(default_factory=dict)
    envoy: envoyproc.EnvoyProcess | None = None
    extproc_up: bool = True

    @property
    def url(self) -> str:
        """The Gateway's listener."""
        assert self.envoy is not None
        return self.envoy.url

    async def stop_extproc(self) -> None:
        """Take the ext_proc down (the fail-open cases)."""
        if self.extproc_up:
            self.extproc_up = False
            await self.service.stop()

    def served(self) -> dict[str, int]:
        """Requests each fake member has finished."""
        return {name: handle.stats.served for name, handle in self.members.items()}


@pytest.fixture
async def gateway(gateway_run: GatewayRun, pool: ExamplePool, envoy_bin: Path,
                  tmp_path: Path) -> AsyncIterator[GatewayStack]:
    """The translated data path on loopback, the service on the example pool (static pools).

    `envoy_bin` (tests/conftest.py) skips, saying why, when the Envoy binary is missing.
    """
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(pool.pools_file(), encoding="utf-8")
    # As the overlay's Deployment runs it: no override_message_timeout (Envoy Gateway renders
    # no max_message_timeout, so the policy's messageTimeout alone covers a hold).
    service = Service(Settings(listen="127.0.0.1:0", metrics_listen="",
                               pools_file=str(pools_file), park_timeout_override=False))
    stack = GatewayStack(service)
    try:
        for name in pool.members + pool.fallbacks:  # (the fallbacks' Services too)
            stack.members[name] = await start_upstream(name, token_delay_ms=1)
        await service.start()
        stack.envoy = run_translated(gateway_run, service.grpc_port,
                                     {name: h.port for name, h in stack.members.items()},
                                     tmp_path / "envoy")
        yield stack
    finally:
        await stop_front_to_back(stack.envoy, stack.stop_extproc(),
                                 service.settings.shutdown_grace, stack.members.values())
