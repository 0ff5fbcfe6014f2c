"""Garbage at the ext_proc gRPC port: the service neither crashes nor leaks streams, tasks or
file descriptors, and keeps answering well-formed streams."""

from __future__ import annotations

import asyncio
import logging
import os
import random

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpcprobe import answers_a_good_request, body_message, headers_message, open_process
from relstack import SERVING, health_status, settle, streams_in_flight

from extproc import metrics
from extproc.logs import Throttled
from extproc.app import Service
from extproc.protocol import service as service_module
from extproc.protocol.service import SERVICE

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def open_fds() -> int:
    """File descriptors this process holds (service and test share it)."""
    return len(os.listdir("/proc/self/fd"))


async def raw_tcp(port: int, payload: bytes) -> bytes:
    """Send bytes, return whatever comes back before the server closes (bounded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 5)
    except (ConnectionError, asyncio.TimeoutError):
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize("payload", [
    pytest.param(random.Random(1).randbytes(64 * 1024), id="random-bytes"),
    pytest.param(H2_PREFACE + random.Random(2).randbytes(4096), id="h2-preface-then-junk"),
    # a frame header announcing a 16 MiB DATA frame on stream 1, then nothing
    pytest.param(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                 + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01", id="h2-giant-frame-header"),
    pytest.param(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", id="http1-request"),
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64, id="tls-hello"),
])
async def test_garbage_on_the_port(service: Service, payload: bytes) -> None:
    assert await answers_a_good_request(service.grpc_port)  # warm: lazily built state exists
    baseline = open_fds()
    for _ in range(20):
        await raw_tcp(service.grpc_port, payload)
    assert await settle(lambda: open_fds() <= baseline), f"{open_fds()} fds, {baseline} before"
    assert await answers_a_good_request(service.grpc_port)
    assert await health_status(service.grpc_port) == SERVING


@pytest.mark.parametrize("method", [f"/{SERVICE}/Nope", "/foo.Bar/Baz", "/", "/x/y/z"])
async def test_unknown_methods_are_unimplemented(service: Service, method: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(method)(b"\x00garbage", timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert await answers_a_good_request(service.grpc_port)


async def _stream_of(port: int, messages: list[bytes]) -> list[ep.ProcessingResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = open_process(channel)
        for message in messages:
            await call.write(message)
        await call.done_writing()
        replies = [reply async for reply in call]
        assert await call.code() == grpc.StatusCode.OK
        return replies


RESPONSE_HEADERS = ep.ProcessingRequest(response_headers=ep.HttpHeaders()).SerializeToString()
RESPONSE_BODY = ep.ProcessingRequest(response_body=ep.HttpBody(body=b"x", end_of_stream=True)) \
    .SerializeToString()
TRAILERS = ep.ProcessingRequest(request_trailers=ep.HttpTrailers()).SerializeToString()


@pytest.mark.parametrize("messages, answers", [  # answers: the kind of each, in order
    pytest.param([], [], id="nothing"),
    pytest.param([body_message(b'{"model": "judge"}')], [], id="body-without-headers"),
    pytest.param([RESPONSE_HEADERS], [], id="response-headers-first"),
    pytest.param([RESPONSE_BODY], [], id="response-body-first"),
    pytest.param([TRAILERS], [], id="trailers-first"),
    pytest.param([b""], [], id="empty-message"),
    # headers answered (CONTINUE), then a response's phases while the body is awaited: Envoy
    # answered the request itself (413 over its buffer limit) and waits for each answer
    pytest.param([headers_message(), RESPONSE_HEADERS, RESPONSE_BODY, TRAILERS],
                 ["request_headers", "response_headers", "response_body", "request_trailers"],
                 id="headers-then-response-phases"),
    pytest.param([headers_message(), headers_message()], ["request_headers"], id="headers-twice"),
])
async def test_out_of_order_messages_end_cleanly(service: Service, messages: list[bytes],
                                                answers: list[str]) -> None:
    replies = await _stream_of(service.grpc_port, messages)
    assert [r.WhichOneof("response") for r in replies] == answers
    assert not any(r.HasField("request_body") or r.dynamic_metadata.fields
                   for r in replies)  # no routing decision
    assert await settle(lambda: streams_in_flight() == 0)
    assert await answers_a_good_request(service.grpc_port)


async def test_undecodable_message_fails_only_its_stream(service: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = open_process(channel)
        await call.write(b"\xff\xff\xff\xff\x0f")  # a truncated varint: not a protobuf
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await settle(lambda: streams_in_flight() == 0)
    assert await answers_a_good_request(service.grpc_port)


async def test_a_garbage_flood_is_counted_and_logged_once(
        service: Service, caplog: pytest.LogCaptureFixture) -> None:
    before = metrics.MALFORMED._value.get()
    # none logged lately (the throttle is the module's: an earlier test may have used it)
    service_module._malformed = Throttled(service_module.log, "undecodable ext_proc message")
    caplog.set_level(logging.WARNING, logger="extproc.protocol.service")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        for _ in range(50):
            call = open_process(channel)
            await call.write(b"\xff\xff\xff\xff\x0f")
            with pytest.raises(grpc.aio.AioRpcError):
                await call.read()
    assert metrics.MALFORMED._value.get() == before + 50
    lines = [r for r in caplog.records if r.getMessage() == "undecodable ext_proc message"]
    assert len(lines) == 1  # one line per 10 s, whatever the flood
    assert not any(r.exc_info for r in caplog.records)  # and never a traceback


async def test_message_over_the_receive_limit_is_refused(service: Service) -> None:
    async with grpc.aio.insecure_channel(
            f"127.0.0.1:{service.grpc_port}",
            options=[("grpc.max_send_message_length", 128 << 20)]) as channel:
        call = open_process(channel)
        await call.write(headers_message())
        await call.read()
        # The receive limit is at least 64 MiB, above Envoy's 32 MiB buffer limit, so only a
        # peer that is not our Envoy can exceed it.
        await call.write(body_message(b"x" * (65 << 20)))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await settle(lambda: streams_in_flight() == 0)
    assert await answers_a_good_request(service.grpc_port)


async def _idle_streams_round(port: int, send_headers: bool, count: int = 200) -> None:
    """Open ``count`` streams that never finish a request, check they are counted, cancel."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        calls = [open_process(channel) for _ in range(count)]
        if send_headers:
            await asyncio.gather(*(c.write(headers_message()) for c in calls))
            replies = await asyncio.gather(*(c.read() for c in calls))
            assert all(r.HasField("request_headers") for r in replies)
        else:
            await asyncio.gather(*(c.wait_for_connection() for c in calls))
        assert await settle(lambda: streams_in_flight() == count), streams_in_flight()
        assert await health_status(port) == SERVING  # still responsive meanwhile
        for call in calls:
            call.cancel()
    assert await settle(lambda: streams_in_flight() == 0), streams_in_flight()


@pytest.mark.parametrize("send_headers", [False, True], ids=["silent", "headers-then-silent"])
async def test_200_idle_streams_cancelled_leak_nothing(service: Service,
                                                       send_headers: bool) -> None:
    # Leaks show as growth from round to round; the first round creates lazily built state.
    await _idle_streams_round(service.grpc_port, send_headers)
    tasks, fds = len(asyncio.all_tasks()), open_fds()
    for _ in range(2):
        await _idle_streams_round(service.grpc_port, send_headers)
        assert await settle(lambda: len(asyncio.all_tasks()) <= tasks), \
            f"{len(asyncio.all_tasks())} tasks, {tasks} after the first round"
        assert await settle(lambda: open_fds() <= fds), f"{open_fds()} fds, {fds} before"
    assert await answers_a_good_request(service.grpc_port)
