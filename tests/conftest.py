"""Shared pytest fixtures: the Envoy binary, fake member upstreams, Envoy processes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from devstack import envoyproc
from devstack.testkit import finish_within, seed_from_env
from devstack.fakemember import UpstreamHandle, start_upstream
from extproc.protocol import answers
from extproc.protocol.service import SERVICE


def pytest_configure(config: pytest.Config) -> None:
    """A soak round's seed (devstack/soak.py), when one is given."""
    seed_from_env()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the exhaustive search explored (test_exhaustive records it as a property,
    which pytest-xdist carries back from the worker that ran it)."""
    lines = sorted(value for report in terminalreporter.stats.get("passed", [])
                   for key, value in report.user_properties if key == "exhaustive")
    if lines:
        terminalreporter.section("policy: exhaustive search")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def envoy_bin() -> Path:
    """The Envoy binary; skips the test when it is not installed."""
    try:
        return envoyproc.envoy_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture
async def upstreams() -> AsyncIterator[dict[str, UpstreamHandle]]:
    """Fake members `judge` and `coder` on free loopback ports, in this test's event loop."""
    handles: dict[str, UpstreamHandle] = {}
    try:
        for name in ("judge", "coder"):
            handles[name] = await start_upstream(name, token_delay_ms=1)
        yield handles
    finally:
        for handle in handles.values():
            await finish_within(handle.stop(), 15, f"fake member {handle.name} to stop")


EnvoyFactory = Callable[..., envoyproc.EnvoyProcess]


@pytest.fixture
def envoy_factory(envoy_bin: Path, tmp_path: Path) -> Iterator[EnvoyFactory]:
    """Start EnvoyProcess(extproc_port, members, **kwargs) instances; all stop at teardown.

    `members` maps cluster name ("judge.demo") to port. Starting blocks until Envoy is ready
    (it does not contact the upstreams, so in-process upstreams need not be served meanwhile).
    """
    started: list[envoyproc.EnvoyProcess] = []

    def start(extproc_port: int, members: dict[str, int], **kwargs: Any) -> envoyproc.EnvoyProcess:
        workdir = tmp_path / f"envoy-{len(started)}"
        envoy = envoyproc.EnvoyProcess(extproc_port, members, workdir=workdir, **kwargs)
        started.append(envoy)
        return envoy.start()

    try:
        yield start
    finally:
        for envoy in started:
            envoy.stop()


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


@dataclass
class StubExtProc(ext_grpc.ExternalProcessorServicer):
    """A stand-in ext_proc for Envoy config tests: routes the body's `model` to `<model>.demo`.

    With `immediate` set to (status, body, headers) it answers every request with that
    immediate response instead. It serves gRPC health as the service does (`set_serving`).
    Not the real service: no pool, no parking.
    """

    port: int = 0
    immediate: tuple[int, bytes, dict[str, str]] | None = None
    streams: int = 0
    server: grpc.aio.Server | None = field(default=None, repr=False)
    health: health_aio.HealthServicer = field(default_factory=health_aio.HealthServicer,
                                              repr=False)

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING under the service's name and "" (as the service does)."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE):
            await self.health.set(name, status)

    async def Process(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """One HTTP request's stream: headers, then (for a body) the buffered body."""
        self.streams += 1
        async for msg in request_iterator:
            kind = msg.WhichOneof("request")
            # The first message is the headers, or (one-message mode) the body alone.
            if kind in ("request_headers", "request_body") and self.immediate:
                status, body, headers = self.immediate
                yield ext_pb.ProcessingResponse(
                    immediate_response=ext_pb.ImmediateResponse(
                        status={"code": status},
                        body=body,
                        headers=ext_pb.HeaderMutation(
                            set_headers=[_header(k, v) for k, v in headers.items()]
                        ),
                        details="stub_immediate",
                    )
                )
                return
            if kind == "request_headers":
                yield ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse())
            elif kind == "request_body":
                model = json.loads(msg.request_body.body or b"{}").get("model", "")
                # The real service's answer: the routing header with a route cache clear (or
                # Envoy keeps the route it already picked), and the same member in dynamic
                # metadata for the one-message mode, where the header mutation is dropped.
                yield ext_pb.ProcessingResponse.FromString(
                    answers.route("x-modelpool-member", f"{model}.demo"))


StubFactory = Callable[[], Awaitable[StubExtProc]]


@pytest.fixture
async def stub_extprocs() -> AsyncIterator[StubFactory]:
    """Start SERVING StubExtProc gRPC servers on free loopback ports, in this test's event loop."""
    started: list[StubExtProc] = []

    async def start() -> StubExtProc:
        stub = StubExtProc()
        stub.server = grpc.aio.server()
        ext_grpc.add_ExternalProcessorServicer_to_server(stub, stub.server)
        health_pb2_grpc.add_HealthServicer_to_server(stub.health, stub.server)
        stub.port = stub.server.add_insecure_port("127.0.0.1:0")
        started.append(stub)
        await stub.server.start()
        await stub.set_serving(True)
        return stub

    try:
        yield start
    finally:
        for n, stub in enumerate(started):
            assert stub.server is not None
            await finish_within(stub.server.stop(grace=None), 15, f"stub ext_proc #{n} to stop")


@pytest.fixture
async def stub_extproc(stub_extprocs: StubFactory) -> StubExtProc:
    """A StubExtProc gRPC server on a free loopback port, in this test's event loop."""
    return await stub_extprocs()
