"""Shared pytest fixtures: the Envoy binary, fake member upstreams, Envoy processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import pytest

from devstack import procs
from devstack.upstream import UpstreamHandle, start_upstream


@pytest.fixture(scope="session")
def envoy_bin() -> Path:
    """The Envoy binary; skips the test when it is not installed."""
    try:
        return procs.envoy_binary()
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
            await handle.stop()


EnvoyFactory = Callable[..., procs.EnvoyProcess]


@pytest.fixture
def envoy_factory(envoy_bin: Path, tmp_path: Path) -> Iterator[EnvoyFactory]:
    """Start EnvoyProcess(extproc_port, members, **kwargs) instances; all stop at teardown.

    `members` maps cluster name ("judge.demo") to port. Starting blocks until Envoy is ready
    (it does not contact the upstreams, so in-process upstreams need not be served meanwhile).
    """
    started: list[procs.EnvoyProcess] = []

    def start(extproc_port: int, members: dict[str, int], **kwargs: Any) -> procs.EnvoyProcess:
        workdir = tmp_path / f"envoy-{len(started)}"
        envoy = procs.EnvoyProcess(extproc_port, members, workdir=workdir, **kwargs)
        started.append(envoy)
        return envoy.start()

    try:
        yield start
    finally:
        for envoy in started:
            envoy.stop()
