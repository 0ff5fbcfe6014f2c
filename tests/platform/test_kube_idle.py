"""probe_idle against a tiny llama.cpp-like /slots server: busy, idle, errors, closed port."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kube_helpers import serving_answers

from extproc.platform.kube.idle import probe_idle

ANSWERS: dict[str, tuple[int, str]] = {
    "idle": (200, '[{"id":0,"is_processing":false},{"id":1,"is_processing":false}]'),
    "busy": (200, '[{"id":0,"is_processing":false},{"id":1,"is_processing":true}]'),
    "error": (500, '{"error":"boom"}'),
    "garbage": (200, "not json"),
    "wrong-shape": (200, '{"slots": []}'),
    "empty": (200, "[]"),
}


@pytest.fixture
async def slots_server() -> AsyncIterator[str]:
    """Serve /<case>/slots on a free loopback port; yields the base URL."""
    async with serving_answers("/{case}/slots", ANSWERS, "application/json") as base:
        yield base


@pytest.mark.parametrize("case, expected", [
    ("idle", True), ("busy", False), ("error", None), ("garbage", None),
    ("wrong-shape", None), ("empty", None),
])
async def test_probe_answers(slots_server: str, case: str, expected: bool | None) -> None:
    async with aiohttp.ClientSession() as session:
        assert await probe_idle(session, f"{slots_server}/{case}/slots", 2.0) is expected


async def test_closed_port_is_unknown() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        async with aiohttp.ClientSession() as session:
            assert await probe_idle(session, f"http://127.0.0.1:{port}/slots", 2.0) is None
