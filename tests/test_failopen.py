"""Fail-open without a hole: with the ext_proc down or hung, nothing reaches a member."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Iterator

import aiohttp
import pytest

from devstack import procs
from devstack.testkit import posted
from devstack.fakemember import UpstreamHandle

pytestmark = pytest.mark.envoy

FALLBACK_BODY = (
    b'{"error":{"message":"model pool router unavailable; retry later",'
    b'"type":"service_unavailable","code":"router_unavailable"}}'
)


def members_of(upstreams: dict[str, UpstreamHandle]) -> dict[str, int]:
    """Cluster name -> port for the fake upstreams."""
    return {f"{name}.demo": handle.port for name, handle in upstreams.items()}


def assert_untouched(upstreams: dict[str, UpstreamHandle]) -> None:
    """No fake member saw any request."""
    assert {n: h.stats.served for n, h in upstreams.items()} == {n: 0 for n in upstreams}


async def assert_fallback(resp: aiohttp.ClientResponse) -> None:
    """The no-routing-header route's answer: 503, Retry-After, the fixed JSON error."""
    assert resp.status == 503
    assert resp.headers["retry-after"] == "5"
    assert resp.headers["content-type"] == "application/json"
    assert await resp.read() == FALLBACK_BODY


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port that completes TCP handshakes but never answers: a hung ext_proc."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # never accept(): connections sit in the backlog
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    "spoof",
    [
        {"x-modelpool-member": "judge.demo"},
        {"X-ModelPool-Member": "coder.demo"},
        {"x-modelpool-member": "judge.demo, coder.demo"},
    ],
)
async def test_spoofed_routing_header_gets_fallback(
    envoy_factory, upstreams: dict[str, UpstreamHandle], spoof: dict[str, str]
) -> None:
    envoy = envoy_factory(procs.free_port(), members_of(upstreams))  # nothing listens there
    async with posted(
        f"{envoy.url}/v1/chat/completions",
        json={"model": "judge", "messages": [{"role": "user", "content": "hi"}]},
        headers=spoof,
    ) as resp:
        await assert_fallback(resp)
    assert_untouched(upstreams)
    entry = envoy.wait_access_log(1)[-1]
    # The early header mutation stripped the client's value before routing (and logging).
    assert entry["details"] == "direct_response"
    assert entry["member"] is None and entry["upstream_cluster"] is None


@pytest.mark.parametrize("method,path", [("GET", "/health"), ("GET", "/nope"), ("DELETE", "/v1/models")])
async def test_other_paths_never_reach_a_member(
    envoy_factory, upstreams: dict[str, UpstreamHandle], method: str, path: str
) -> None:
    envoy = envoy_factory(procs.free_port(), members_of(upstreams))
    async with aiohttp.ClientSession() as http:
        async with http.request(
            method, f"{envoy.url}{path}", headers={"x-modelpool-member": "judge.demo"}
        ) as resp:
            await assert_fallback(resp)
    assert_untouched(upstreams)


async def test_oversized_body_with_extproc_down(
    envoy_factory, upstreams: dict[str, UpstreamHandle]
) -> None:
    # Envoy usually learns the ext_proc is down before the body is buffered (503 fallback);
    # either way the answer is a JSON error and no member sees the request.
    envoy = envoy_factory(procs.free_port(), members_of(upstreams))
    async with posted(
        f"{envoy.url}/v1/audio/transcriptions",
        data=b"a" * (33 * 1024 * 1024),
        headers={"x-modelpool-member": "judge.demo"},
    ) as resp:
        assert resp.status in (413, 503)
        assert resp.headers["content-type"] == "application/json"
        assert "error" in await resp.json()
    assert_untouched(upstreams)


async def test_oversized_body_with_extproc_hung_is_json_413(
    envoy_factory, upstreams: dict[str, UpstreamHandle], blackhole: int
) -> None:
    envoy = envoy_factory(blackhole, members_of(upstreams))
    async with posted(
        f"{envoy.url}/v1/audio/transcriptions",
        data=b"a" * (33 * 1024 * 1024),
        headers={"x-modelpool-member": "judge.demo"},
    ) as resp:
        assert resp.status == 413
        assert resp.headers["content-type"] == "application/json"
        body = await resp.json()
    assert body["error"] == {
        "message": "request body too large (limit 32 MiB)",
        "type": "invalid_request_error",
        "code": "payload_too_large",
    }
    assert_untouched(upstreams)
    assert envoy.wait_access_log(1)[-1]["details"] == "request_payload_too_large"


async def test_hung_extproc_fails_open_after_message_timeout(
    envoy_factory, upstreams: dict[str, UpstreamHandle], blackhole: int
) -> None:
    envoy = envoy_factory(blackhole, members_of(upstreams))
    started = time.monotonic()
    async with posted(
        f"{envoy.url}/v1/chat/completions",
        json={"model": "judge"},
        headers={"x-modelpool-member": "judge.demo"},
        timeout=aiohttp.ClientTimeout(total=25),
    ) as resp:
        await assert_fallback(resp)
    elapsed = time.monotonic() - started
    assert 9.8 <= elapsed < 20, elapsed  # message_timeout is 10 s; the client gives up at 25
    assert_untouched(upstreams)


async def test_stream_finishes_when_extproc_dies_mid_response(
    envoy_factory, stub_extproc, upstreams: dict[str, UpstreamHandle]
) -> None:
    envoy = envoy_factory(stub_extproc.port, members_of(upstreams))
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{envoy.url}/v1/chat/completions?delay_ms=10",
            json={"model": "judge", "stream": True, "max_tokens": 60, "messages": []},
        ) as resp:
            assert resp.status == 200
            first = await resp.content.readline()
            await stub_extproc.server.stop(grace=None)  # the ext_proc dies mid-stream
            rest = [raw async for raw in resp.content]
        events = [line.strip() for line in [first, *rest] if line.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]" and len(events) == 60 + 2

        # The next request finds no ext_proc and gets the fallback.
        await asyncio.sleep(0.1)
        async with http.post(f"{envoy.url}/v1/chat/completions", json={"model": "judge"}) as resp:
            await assert_fallback(resp)
    assert upstreams["judge"].stats.inference == 1 and upstreams["coder"].stats.served == 0
