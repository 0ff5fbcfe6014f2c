"""The server's limits on loopback (extproc/transport/server.py, call.py): grpc-timeout, a
message that does not parse, the handshake and idle timeouts, the connection cap, a turn's
worth of frames per connection. Waits are bounded; nothing is asserted about time itself."""

from __future__ import annotations

import asyncio
import logging
import struct

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_h2_server import WAIT, Factory, Frames, kind, method, serve, settle

from extproc.logs import Throttled
from extproc.transport import call as calls
from extproc.transport import frames as f
from extproc.transport import server as native

__all__ = ["serve"]  # the fixture, shared with test_h2_server


@pytest.fixture(autouse=True)
def fresh_throttles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's warnings unthrottled by an earlier test's (the throttles are the module's)."""
    for module, name in ((calls, "_bad_messages"), (native, "_over_cap"),
                         (native, "_peer_errors")):
        old = getattr(module, name)
        monkeypatch.setattr(module, name, Throttled(old._log, old._msg))  # noqa: SLF001


async def test_grpc_timeout_ends_the_call_and_its_handler(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await method(channel, "Hang")(b"deadline", timeout=0.3)
    assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert await settle(lambda: served.state.cancelled == ["deadline"])
    assert await settle(lambda: served.open_calls() == 0)


async def test_a_malformed_grpc_timeout_is_internal(serve: Factory) -> None:
    served = await serve()
    raw = await Frames.open(served.port)
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/t.S/Echo"),
              (b":authority", b"t"), (b"content-type", b"application/grpc"),
              (b"te", b"trailers"), (b"grpc-timeout", b"12x")]
    raw.writer.write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1,
                             raw.encoder.encode(fields)))
    frames = await raw.until(lambda fs: any(k == f.HEADERS for k, *_ in fs))
    block = dict(hpack.Decoder().decode(kind(frames, f.HEADERS)[0][1]))
    assert block["grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0])
    raw.writer.close()


async def test_messages_that_do_not_parse_are_internal_and_logged_once(
        serve: Factory, caplog: pytest.LogCaptureFixture) -> None:
    served = await serve()
    caplog.set_level(logging.WARNING, logger="extproc.transport.call")
    async with served.channel() as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")  # raw bytes out
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await check(b"\xff\xff\xff garbage")
            assert raised.value.code() is grpc.StatusCode.INTERNAL
        stub = health_pb2_grpc.HealthStub(channel)  # and the server still answers
        assert (await stub.Check(health_pb2.HealthCheckRequest())).status == 1
    lines = [r for r in caplog.records if "does not parse" in r.getMessage()]
    assert len(lines) == 1 and not any(r.exc_info for r in lines)


async def test_a_connection_that_never_speaks_is_closed(
        serve: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "HANDSHAKE_TIMEOUT", 0.2)
    served = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    assert await asyncio.wait_for(reader.read(), WAIT) != b""  # our SETTINGS, then EOF
    assert reader.at_eof()
    writer.close()
    assert await settle(lambda: not served.server.connections)


async def test_an_idle_connection_is_drained_without_losing_a_call(serve: Factory) -> None:
    served = await serve(idle_timeout=0.4)
    raw = await Frames.open(served.port)
    frames = await raw.until(lambda fs: any(k == f.PING for k, *_ in fs))
    notices = [struct.unpack(">II", p[:8]) for s, p in kind(frames, f.GOAWAY)]
    assert notices == [(f.MAX_WINDOW, f.NO_ERROR)]  # the notice: every stream still welcome
    # a call the peer sent before it saw the notice is served in full
    raw.request(1, b"late", b"/t.S/Echo")
    ping = next(p for k, fl, s, p in frames if k == f.PING and not fl & f.ACK)
    raw.writer.write(f.frame(f.PING, f.ACK, 0, ping))
    frames = await raw.until(lambda fs: raw.eof)
    assert [struct.unpack(">II", p[:8]) for s, p in kind(frames, f.GOAWAY)][-1] \
        == (1, f.NO_ERROR)
    assert b"late" in b"".join(p for s, p in kind(frames, f.DATA) if s == 1)
    assert await settle(lambda: not served.server.connections)


async def test_connections_past_the_cap_are_refused_and_said_when_all_are_busy(
        serve: Factory, caplog: pytest.LogCaptureFixture) -> None:
    served = await serve(max_connections=2)
    caplog.set_level(logging.WARNING, logger="extproc.transport.server")
    kept = [await Frames.open(served.port) for _ in range(2)]
    for raw in kept:
        raw.request(1, b"held")  # a call that hangs: every connection is busy
    assert await settle(lambda: len(served.server.connections) == 2
                        and all(p.calls for p in served.server.connections))
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), WAIT)
    writer.close()
    assert any("--max-connections" in r.getMessage() for r in caplog.records)
    for raw in kept:
        raw.writer.close()
    assert await settle(lambda: not served.server.connections)
    async with served.channel() as channel:  # room again
        assert await method(channel, "Echo")(b"again", timeout=WAIT) == b"again"


async def test_one_connections_flood_of_frames_waits_its_turn(serve: Factory) -> None:
    served = await serve()
    flooding = await Frames.open(served.port)
    flooding.writer.write(f.frame(f.HEADERS, f.END_HEADERS, 1, flooding.encoder.encode(
        [(n, b"/t.S/Len" if n == b":path" else v) for n, v in (
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", b""),
            (b":authority", b"t"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers"))])))
    size = 200_000  # a message in one-byte DATA frames: ~800 turns of the loop
    message = struct.pack(">BI", 0, size) + b"m" * size
    flooding.writer.write(b"".join(f.frame(f.DATA, 0, 1, message[i:i + 1])
                                   for i in range(len(message) - 1))
                          + f.frame(f.DATA, f.END_STREAM, 1, message[-1:]))
    assert await settle(lambda: any(p.conn.backlog for p in served.server.connections))
    async with served.channel() as channel:
        assert await method(channel, "Echo")(b"probe", timeout=WAIT) == b"probe"
        # answered while the flood still waited: the loop turned between its frames
        assert served.state.received == []
    await flooding.until(lambda fs: any(k == f.HEADERS and fl & f.END_STREAM
                                        for k, fl, _s, _p in fs))
    assert served.state.received == [size]
    flooding.writer.close()
