"""What a client, or anyone who reaches a port, can do with the shipped defaults: raise its own
priority (no), hold without bound (no), read the models of every namespace from an error (no),
keep a silent connection to the metrics port or read its debug view (no)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from reliability.grpcprobe import body_message, headers_message, open_process

from devstack.testkit import eventually
from extproc.app import Service
from extproc.platform.static import StaticPlatform
from extproc.policy.model import PoolKey, PoolSpec
from extproc.protocol.trust import granted
from extproc.runtime.driver import PoolDriver
from extproc.settings import Settings

KEY = PoolKey("demo", "shared-gpu")
OTHER = PoolKey("team-b", "private")


class NeverLoads(StaticPlatform):
    """Members never change: a swap stays open, so requests for a cold member stay held."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Accepted, never carried out."""


@contextlib.asynccontextmanager
async def _service(**changes: Any) -> AsyncIterator[Service]:
    specs = [PoolSpec(KEY, ("judge", "coder"), default="judge", swap_budget=60.0),
             PoolSpec(OTHER, ("secret-model",), default="secret-model")]
    service = Service(Settings(**{"listen": "127.0.0.1:0", "metrics_listen": "", **changes}),
                      NeverLoads(specs))
    await service.start()
    try:
        await asyncio.wait_for(service.platform.synced.wait(), 10)
        yield service
    finally:
        await service.stop()


async def _open(channel: grpc.aio.Channel, model: str,
                headers: tuple[tuple[str, str], ...] = ()) -> Any:
    """A request's stream up to its body sent; the call, to read the answer from."""
    call = open_process(channel)
    await call.write(headers_message(extra=headers))
    assert (await call.read()).HasField("request_headers")
    await call.write(body_message(json.dumps({"model": model}).encode()))
    return call


def _error(answer: ep.ProcessingResponse) -> tuple[int, dict[str, Any]]:
    immediate = answer.immediate_response
    return immediate.status.code, json.loads(immediate.body)["error"]


# ---- priority headers ------------------------------------------------------------------------

@pytest.mark.parametrize("mode, sent, objective, expected", [
    ("lower", "10", "", ("", 0)),  # raising: capped at the default
    ("lower", "-3", "", ("", -3)),  # lowering: a batch client may step aside
    ("lower", "", "critical", ("critical", 0)),  # the pool maps critical to 10: capped
    ("lower", "", "batch", ("batch", -5)),
    ("trust", "10", "", ("", 10)),
    ("trust", "", "critical", ("critical", None)),  # the policy maps it (10)
    ("ignore", "-3", "batch", ("", None)),
])
def test_client_priority_grants(mode: str, sent: str, objective: str,
                                expected: tuple[str, int | None]) -> None:
    rank = int(sent) if sent else None
    assert granted(mode, objective, rank, {"critical": 10, "batch": -5}) == expected


async def test_a_client_cannot_raise_its_priority_by_default(monkeypatch) -> None:
    arrivals: list[tuple[str, int | None]] = []
    arrive = PoolDriver.arrive

    def spy(self: PoolDriver, member: str, max_wait: float = float("inf"),
            activation: str = "", objective: str = "", priority: int | None = None) -> Any:
        arrivals.append((objective, priority))
        return arrive(self, member, max_wait, activation, objective, priority)
    monkeypatch.setattr(PoolDriver, "arrive", spy)
    sent = [(("x-modelpool-priority", "100"),), (("x-modelpool-priority", "-2"),),
            (("x-gateway-inference-objective", "critical"),)]
    async with _service() as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            calls = [await _open(channel, "judge", headers) for headers in sent]
            await eventually(lambda: len(arrivals) == len(sent), 10, "every request arrived")
            for call in calls:
                call.cancel()
    assert arrivals == [("", 0), ("", -2), ("critical", 0)]


async def test_ignored_priority_headers_are_not_even_read() -> None:
    async with _service(client_priority="ignore") as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            call = await _open(channel, "coder", (("x-modelpool-priority", "high"),))
            answer = await call.read()
            call.cancel()
    assert not answer.HasField("immediate_response"), answer  # held, not a 400


# ---- the held bound --------------------------------------------------------------------------

async def test_the_default_bounds_held_requests() -> None:
    bound = Settings().max_held
    assert bound > 0
    async with _service() as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            calls = [await _open(channel, "coder") for _ in range(bound + 3)]
            try:
                driver = service.hub.drivers()[0]
                await eventually(lambda: driver.view().held == bound, 20, "the bound held")
                # the last three found the bound full: 503 at once, the others stay held
                for call in calls[-3:]:
                    status, error = _error(await asyncio.wait_for(call.read(), 10))
                    assert (status, error["code"]) == (503, "too_many_held")
                assert driver.view().held == bound
            finally:
                for call in calls:
                    call.cancel()


# ---- the unknown model's answer --------------------------------------------------------------

async def test_an_unknown_model_answer_lists_no_models() -> None:
    async with _service() as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            call = await _open(channel, "ghost")
            status, error = _error(await call.read())
            call.cancel()
    assert (status, error["code"]) == (404, "model_not_found")
    assert "ghost" in error["message"]
    for name in ("judge", "coder", "secret-model"):
        assert name not in error["message"], error["message"]


# ---- the metrics port ------------------------------------------------------------------------

async def _trickle(writer: asyncio.StreamWriter) -> None:
    """A request head that never ends: one header byte every half second."""
    writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
    with contextlib.suppress(ConnectionError):
        while True:
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.5)


@pytest.mark.parametrize("sending", ["nothing", "a head that never ends"])
async def test_the_metrics_port_closes_a_connection_without_a_request(sending: str) -> None:
    timeout = Settings().metrics_idle_timeout
    async with _service(metrics_listen="127.0.0.1:0") as service:
        reader, writer = await asyncio.open_connection("127.0.0.1", service.metrics_port)
        trickle = asyncio.create_task(_trickle(writer)) if sending != "nothing" else None
        try:
            # no whole request: the server hangs up once the idle timeout has passed
            assert await asyncio.wait_for(reader.read(1), timeout + 20) == b""
        finally:
            if trickle is not None:
                trickle.cancel()
                await asyncio.gather(trickle, return_exceptions=True)
            writer.close()


async def test_debug_endpoints_are_off_unless_enabled() -> None:
    for enabled, expected in ((False, 404), (True, 200)):
        async with _service(metrics_listen="127.0.0.1:0", debug_endpoints=enabled) as service:
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{service.metrics_port}"
                async with http.get(f"{base}/debug/pools") as reply:
                    assert reply.status == expected
                    if enabled:
                        assert {p["key"]["namespace"] for p in await reply.json()} == {
                            "demo", "team-b"}
                async with http.get(f"{base}/metrics") as reply:
                    assert reply.status == 200
