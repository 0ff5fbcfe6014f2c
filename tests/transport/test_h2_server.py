"""Our gRPC server (extproc/transport/server.py) on loopback: a real grpcio aio client, and
raw sockets speaking HTTP/2 through the independent ``h2`` library where a test needs frames
a gRPC client would not send."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import ssl
import subprocess
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
import h2.config
import h2.connection
import h2.events as ev
import h2.settings
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from extproc.transport import frames as f
from extproc.transport.listener import Server, tls_context

WAIT = 10  # seconds: a bound on every wait, never a measured time

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/t.S/Hang"),
           (b":authority", b"test"), (b"content-type", b"application/grpc"),
           (b"te", b"trailers")]


@dataclass
class State:
    """What the handlers saw."""

    started: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: list[str] = field(default_factory=list)
    finally_ran: list[str] = field(default_factory=list)
    done_callbacks: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    received: list[int] = field(default_factory=list)
    yielded: int = 0


def handlers(state: State) -> grpc.GenericRpcHandler:
    """The test service ``t.S``: bytes in, bytes out (no serializers)."""

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    async def length(request: bytes, context: Any) -> bytes:
        state.received.append(len(request))
        return hashlib.sha256(request).hexdigest().encode()

    async def big(request: bytes, context: Any) -> bytes:
        return bytes(range(256)) * (int(request) // 256)

    async def chunks(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            state.yielded += 1
            yield b"%d" % i

    async def bidi(requests: Any, context: Any) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message.upper()

    async def abort(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, request.decode())
        raise AssertionError("abort returned")

    async def fail(request: bytes, context: Any) -> bytes:
        raise ValueError("boom")

    async def self_cancel(request: bytes, context: Any) -> bytes:
        raise asyncio.CancelledError

    async def hang(request: bytes, context: Any) -> bytes:
        name = request.decode() or "hang"
        context.add_done_callback(lambda _ctx: state.done_callbacks.append(name))
        state.started.put_nowait(name)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            state.cancelled.append(name)
            raise
        finally:
            state.finally_ran.append(name)
        return b""

    async def bad_callback(request: bytes, context: Any) -> bytes:
        def callback(_ctx: Any) -> None:
            raise RuntimeError("a done callback failing")
        context.add_done_callback(callback)
        state.started.put_nowait("bad callback")
        await asyncio.Event().wait()
        return b""

    async def slow(request: bytes, context: Any) -> bytes:
        state.started.put_nowait("slow")
        await state.release.wait()
        return b"slow done"

    async def lazy(requests: Any, context: Any) -> AsyncIterator[bytes]:
        count = 0
        async for _message in requests:
            count += 1
            if count == 1:  # then reads nothing until released
                state.started.put_nowait("lazy")
                await state.release.wait()
        yield b"%d" % count

    unary = grpc.unary_unary_rpc_method_handler
    return grpc.method_handlers_generic_handler("t.S", {
        "Echo": unary(echo), "Len": unary(length), "Big": unary(big),
        "Abort": unary(abort), "Fail": unary(fail), "SelfCancel": unary(self_cancel),
        "Hang": unary(hang), "Slow": unary(slow), "BadCallback": unary(bad_callback),
        "Chunks": grpc.unary_stream_rpc_method_handler(chunks),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Lazy": grpc.stream_stream_rpc_method_handler(lazy),
    })


@dataclass
class Served:
    """A started server, where it listens, and its handlers' state."""

    server: Server
    target: str
    port: int
    state: State
    health: health_aio.HealthServicer

    def channel(self, **options: int) -> grpc.aio.Channel:
        """A grpcio client channel to the server."""
        return grpc.aio.insecure_channel(self.target, options=list(options.items()))

    def open_calls(self) -> int:
        """Calls and streams the server still keeps, over all its connections."""
        return sum(len(p.calls) + p.conn.open_streams for p in self.server.connections)


Factory = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve() -> AsyncIterator[Factory]:
    """Start servers (stopped at the end of the test)."""
    started: list[Server] = []

    async def start(listen: str = "127.0.0.1:0", **kw: int) -> Served:
        kw.setdefault("max_message", 64 << 20)
        server = Server(**kw)
        state = State()
        server.add_generic_rpc_handlers((handlers(state),))
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        port = await server.start(listen)
        started.append(server)
        target = listen if listen.startswith("unix:") else f"127.0.0.1:{port}"
        return Served(server, target, port, state, health)

    yield start
    for server in started:
        await asyncio.wait_for(server.stop(0), WAIT)


async def settle(predicate: Callable[[], bool]) -> bool:
    """Wait (bounded) until ``predicate()`` holds."""
    for _ in range(WAIT * 100):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


def method(channel: grpc.aio.Channel, name: str, kind: str = "unary_unary") -> Any:
    """A bytes-in, bytes-out client stub for ``/t.S/name``."""
    return getattr(channel, kind)(f"/t.S/{name}")


# ---- calls through a grpcio client -----------------------------------------------------------


async def test_unary_server_streaming_and_bidi_calls(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        assert await method(channel, "Echo")(b"hello", timeout=WAIT) == b"hello"
        assert await method(channel, "Echo")(b"", timeout=WAIT) == b""
        got = [m async for m in method(channel, "Chunks", "unary_stream")(b"100", timeout=WAIT)]
        assert got == [b"%d" % i for i in range(100)]
        call = method(channel, "Bidi", "stream_stream")(timeout=WAIT)
        for word in (b"a", b"bc", b"def"):
            await call.write(word)
            assert await call.read() == word.upper()
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    assert await settle(lambda: served.open_calls() == 0)


async def test_calls_over_a_unix_socket(serve: Factory, tmp_path: Path) -> None:
    served = await serve(f"unix:{tmp_path / 'grpc.sock'}")
    assert served.port == 0
    async with served.channel() as channel:
        assert await method(channel, "Echo")(b"over unix", timeout=WAIT) == b"over unix"


async def test_a_40_mb_request_reaches_its_handler(serve: Factory) -> None:
    served = await serve()
    body = bytes(range(256)) * (40 * 4096)  # 40 MiB: past the 16 MiB connection window
    async with served.channel() as channel:
        digest = await method(channel, "Len")(body, timeout=60)
    assert digest == hashlib.sha256(body).hexdigest().encode()
    assert served.state.received == [len(body)]


async def test_a_reply_larger_than_the_client_windows_arrives_whole(serve: Factory) -> None:
    served = await serve()
    size = 20 << 20
    async with served.channel(**{"grpc.max_receive_message_length": 32 << 20}) as channel:
        reply = await method(channel, "Big")(b"%d" % size, timeout=60)
        assert reply == bytes(range(256)) * (size // 256)
        # the connection still serves calls after it
        assert await method(channel, "Echo")(b"after", timeout=WAIT) == b"after"


async def test_many_concurrent_calls_on_one_connection(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        echo = method(channel, "Echo")
        replies = await asyncio.gather(*(echo(b"m%d" % i * 1000, timeout=WAIT)
                                         for i in range(200)))
    assert replies == [b"m%d" % i * 1000 for i in range(200)]
    assert await settle(lambda: served.open_calls() == 0)


async def test_an_unknown_method_is_unimplemented(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        for name in ("/t.S/Nope", "/other.Service/Echo", "/"):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary(name)(b"x", timeout=WAIT)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert name in caught.value.details()
    assert await settle(lambda: served.open_calls() == 0)


@pytest.mark.parametrize("details", ["plain words", "100% sure", "naïve — ünïcödé ✓",
                                     "line\nbreak\ttab", "%41 stays literal"])
async def test_abort_sends_its_status_and_a_percent_encoded_message(
        serve: Factory, details: str) -> None:
    served = await serve()
    async with served.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "Abort")(details.encode(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == details


async def test_a_message_over_the_limit_is_resource_exhausted(serve: Factory) -> None:
    served = await serve(max_message=1 << 20)
    async with served.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "Len")(b"x" * ((1 << 20) + 1), timeout=WAIT)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert served.state.received == []
        # the limit itself passes, and the connection lives on
        await method(channel, "Len")(b"x" * (1 << 20), timeout=WAIT)
        assert served.state.received == [1 << 20]
    assert await settle(lambda: served.open_calls() == 0)


async def test_a_handler_exception_is_unknown(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "Fail")(b"", timeout=WAIT)
        assert caught.value.code() == grpc.StatusCode.UNKNOWN
        assert "boom" not in caught.value.details()  # no internals to the peer
        assert await method(channel, "Echo")(b"still", timeout=WAIT) == b"still"


async def test_a_cancelled_call_cancels_its_handler_and_runs_done_callbacks(
        serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        call = method(channel, "Hang")(b"c1", timeout=WAIT)
        assert await asyncio.wait_for(served.state.started.get(), WAIT) == "c1"
        call.cancel()  # RST_STREAM CANCEL from the client
        assert await settle(lambda: served.state.finally_ran == ["c1"])
        assert served.state.cancelled == ["c1"]
        assert served.state.done_callbacks == ["c1"]
        assert await settle(lambda: served.open_calls() == 0)
        assert await method(channel, "Echo")(b"next", timeout=WAIT) == b"next"


async def test_a_failing_done_callback_harms_no_other_call(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        slow = asyncio.ensure_future(method(channel, "Slow")(b"", timeout=WAIT))
        bad = method(channel, "BadCallback")(b"", timeout=WAIT)
        assert {await asyncio.wait_for(served.state.started.get(), WAIT)
                for _ in range(2)} == {"slow", "bad callback"}
        bad.cancel()  # its callback runs where the connection reads (the RST_STREAM)
        assert await settle(lambda: sum(len(p.calls) for p in served.server.connections) == 1)
        served.state.release.set()
        assert await asyncio.wait_for(slow, WAIT) == b"slow done"  # same connection


async def test_a_handler_raising_cancelled_error_ends_its_call(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(channel, "SelfCancel")(b"", timeout=WAIT)
        # the stream is reset (CANCEL), not left open for the client to wait out its deadline
        assert caught.value.code() == grpc.StatusCode.CANCELLED
        assert await settle(lambda: served.open_calls() == 0)


async def test_health_check_and_watch(serve: Factory) -> None:
    served = await serve()
    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    await served.health.set("pool", serving)
    async with served.channel() as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service="pool"), timeout=WAIT)
        assert reply.status == serving
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=WAIT)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="pool"), timeout=WAIT)
        assert (await watch.read()).status == serving
        await served.health.set("pool", not_serving)
        assert (await watch.read()).status == not_serving
        await served.health.set("pool", serving)
        assert (await watch.read()).status == serving
        watch.cancel()
        assert await settle(lambda: served.open_calls() == 0)


async def test_stop_lets_calls_finish_within_grace_and_cuts_the_rest(serve: Factory) -> None:
    served = await serve()
    async with served.channel() as channel:
        slow = asyncio.ensure_future(method(channel, "Slow")(b"", timeout=WAIT))
        hung = asyncio.ensure_future(method(channel, "Hang")(b"cut", timeout=WAIT))
        assert {await asyncio.wait_for(served.state.started.get(), WAIT)
                for _ in range(2)} == {"slow", "cut"}
        stopping = asyncio.ensure_future(served.server.stop(3.0))  # ample for the slow one
        await asyncio.sleep(0)  # GOAWAY said; the slow call may still end well
        served.state.release.set()
        assert await asyncio.wait_for(slow, WAIT) == b"slow done"
        await asyncio.wait_for(stopping, WAIT)
        # the cut handler unwound before stop() returned
        assert served.state.cancelled == ["cut"] and served.state.finally_ran == ["cut"]
        assert served.state.done_callbacks == ["cut"]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(hung, WAIT)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not served.server.connections


async def test_no_new_connection_after_stop(serve: Factory) -> None:
    served = await serve()
    await served.server.stop(0)
    with pytest.raises(OSError):
        _r, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.close()


# ---- raw HTTP/2 on the socket ----------------------------------------------------------------


class Raw:
    """An h2 client connection on a real socket to the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.events: list = []
        self.eof = False

    @classmethod
    async def open(cls, port: int, settings: dict[int, int] | None = None) -> "Raw":
        """Connect and send the preface and SETTINGS."""
        raw = cls(*await asyncio.open_connection("127.0.0.1", port))
        raw.h2.local_settings = h2.settings.Settings(client=True, initial_values=settings or {})
        raw.h2.initiate_connection()
        raw.flush()
        return raw

    def flush(self) -> None:
        """Write what the h2 client has to say."""
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)

    def send_raw(self, data: bytes) -> None:
        """Bytes h2 would not send."""
        self.writer.write(data)

    async def until(self, predicate: Callable[[list], bool]) -> list:
        """Read (bounded) until ``predicate(events)`` holds or the server closes; the events."""
        async def read() -> None:
            while not predicate(self.events):
                data = await self.reader.read(65536)
                if not data:
                    self.eof = True
                    return
                self.events += self.h2.receive_data(data)
                self.flush()
        await asyncio.wait_for(read(), WAIT)
        return self.events

    def request(self, path: bytes = b"/t.S/Hang", message: bytes = b"",
                end: bool = True) -> int:
        """Open a stream with one gRPC message."""
        sid = self.h2.get_next_available_stream_id()
        headers = [(n, path if n == b":path" else v) for n, v in REQUEST]
        self.h2.send_headers(sid, headers)
        self.h2.send_data(sid, struct.pack(">BI", 0, len(message)) + message, end_stream=end)
        self.flush()
        return sid

    def close(self) -> None:
        """Close the socket."""
        self.writer.close()


def of(events: list, kind: type) -> list:
    """The events of one kind."""
    return [e for e in events if isinstance(e, kind)]


async def test_ping_is_acknowledged(serve: Factory) -> None:
    served = await serve()
    raw = await Raw.open(served.port)
    raw.h2.ping(b"pingpong")
    raw.flush()
    events = await raw.until(lambda es: of(es, ev.PingAckReceived))
    assert of(events, ev.PingAckReceived)[0].ping_data == b"pingpong"
    raw.close()


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
                                     b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"])
async def test_a_wrong_preface_gets_goaway_and_close(serve: Factory, garbage: bytes) -> None:
    served = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(garbage)
    data = await asyncio.wait_for(reader.read(), WAIT)  # to EOF: the server closes
    writer.close()
    kinds, at = [], 0
    while at < len(data):
        first, _flags, _sid = f.HEADER.unpack_from(data, at)
        kinds.append((first & 0xFF, data[at + 9:at + 9 + (first >> 8)]))
        at += 9 + (first >> 8)
    assert kinds[0][0] == f.SETTINGS and kinds[-1][0] == f.GOAWAY
    assert struct.unpack(">II", kinds[-1][1][:8])[1] == f.PROTOCOL_ERROR
    assert await settle(lambda: not served.server.connections)


async def test_hpack_garbage_gets_compression_error_and_cuts_the_calls(serve: Factory) -> None:
    served = await serve()
    raw = await Raw.open(served.port)
    # SETTINGS both ways first: nothing of ours after the garbage may reach a closed socket
    # (its RST could cost the GOAWAY we read for)
    await raw.until(lambda es: of(es, ev.SettingsAcknowledged))
    raw.request(message=b"victim")
    assert await asyncio.wait_for(served.state.started.get(), WAIT) == "victim"
    raw.send_raw(f.frame(f.HEADERS, f.END_HEADERS, 3, b"\xff\xff\xff\xff\xff"))
    events = await raw.until(lambda es: raw.eof)
    assert [e.error_code for e in of(events, ev.ConnectionTerminated)] == [f.COMPRESSION_ERROR]
    assert await settle(lambda: served.state.finally_ran == ["victim"])
    assert served.state.cancelled == ["victim"]
    assert await settle(lambda: not served.server.connections)


async def test_streams_over_the_limit_are_refused(serve: Factory) -> None:
    served = await serve(max_concurrent_streams=2)
    raw = await Frames.open(served.port)
    for sid, message in ((1, b"one"), (3, b"two"), (5, b"three")):
        raw.request(sid, message)
    frames = await raw.until(lambda fs: kind(fs, f.RST_STREAM))
    assert kind(frames, f.RST_STREAM) == [(5, struct.pack(">I", f.REFUSED_STREAM))]
    assert sorted([await asyncio.wait_for(served.state.started.get(), WAIT)
                   for _ in range(2)]) == ["one", "two"]
    raw.writer.write(f.rst_stream(1, f.CANCEL))
    assert await settle(lambda: served.state.finally_ran == ["one"])
    raw.request(7, b"four")  # room again
    assert await asyncio.wait_for(served.state.started.get(), WAIT) == "four"
    assert len(kind(raw.frames, f.RST_STREAM)) == 1
    raw.writer.close()


class Frames:
    """A socket to the server spoken in hand-made frames; what comes back, parsed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.frames: list[tuple[int, int, int, bytes]] = []
        self._inbox = b""
        self.eof = False

    @classmethod
    async def open(cls, port: int) -> "Frames":
        """Connect, send the preface, empty SETTINGS and the ACK of the server's (which a
        client sends once it has read them: the server closes a connection without one)."""
        frames = cls(*await asyncio.open_connection("127.0.0.1", port))
        frames.writer.write(f.PREFACE + f.settings({}) + f.frame(f.SETTINGS, f.ACK, 0))
        return frames

    def request(self, sid: int, message: bytes, path: bytes = b"/t.S/Hang") -> None:
        """A gRPC request for ``path`` on ``sid``, ended."""
        fields = [(n, path if n == b":path" else v) for n, v in REQUEST]
        self.writer.write(
            f.frame(f.HEADERS, f.END_HEADERS, sid, self.encoder.encode(fields))
            + f.frame(f.DATA, f.END_STREAM, sid, struct.pack(">BI", 0, len(message)) + message))

    async def until(self, predicate: Callable[[list], bool]) -> list:
        """Read (bounded) until ``predicate(frames)`` holds or the server closes."""
        async def read() -> None:
            while not predicate(self.frames):
                data = await self.reader.read(65536)
                if not data:
                    self.eof = True
                    return
                self._inbox += data
                while len(self._inbox) >= 9:
                    first, flags, sid = f.HEADER.unpack_from(self._inbox)
                    if len(self._inbox) < 9 + (first >> 8):
                        break
                    payload = self._inbox[9:9 + (first >> 8)]
                    self._inbox = self._inbox[9 + (first >> 8):]
                    self.frames.append((first & 0xFF, flags, sid, payload))
        await asyncio.wait_for(read(), WAIT)
        return self.frames


def kind(frames: list, wanted: int) -> list[tuple[int, bytes]]:
    """(stream, payload) of the frames of one type."""
    return [(sid, payload) for k, _fl, sid, payload in frames if k == wanted]


async def test_stop_says_goaway_and_refuses_new_streams(serve: Factory) -> None:
    served = await serve()
    raw = await Frames.open(served.port)
    raw.request(1, b"open")
    assert await asyncio.wait_for(served.state.started.get(), WAIT) == "open"
    stopping = asyncio.ensure_future(served.server.stop(WAIT))
    frames = await raw.until(lambda fs: kind(fs, f.GOAWAY))
    assert kind(frames, f.GOAWAY) == [(0, struct.pack(">II", 1, f.NO_ERROR))]
    raw.request(3, b"late")  # sent before the client saw the GOAWAY
    frames = await raw.until(lambda fs: kind(fs, f.RST_STREAM))
    assert kind(frames, f.RST_STREAM) == [(3, struct.pack(">I", f.REFUSED_STREAM))]
    assert not stopping.done()  # the open call still has its grace
    raw.writer.write(f.rst_stream(1, f.CANCEL))  # it ends: stop() need not wait out the grace
    await asyncio.wait_for(stopping, WAIT)
    assert served.state.cancelled == ["open"] and served.state.finally_ran == ["open"]
    await raw.until(lambda fs: False)
    assert raw.eof  # and the connection is closed
    raw.writer.close()


async def test_a_request_that_is_not_grpc_gets_415(serve: Factory) -> None:
    served = await serve()
    raw = await Raw.open(served.port)
    sid = raw.h2.get_next_available_stream_id()
    raw.h2.send_headers(sid, [(n, b"application/json" if n == b"content-type" else v)
                              for n, v in REQUEST], end_stream=True)
    raw.flush()
    events = await raw.until(lambda es: of(es, ev.StreamEnded))
    assert of(events, ev.ResponseReceived)[0].headers == [(b":status", b"415")]
    assert served.state.started.empty()
    assert await settle(lambda: served.open_calls() == 0)
    raw.close()


async def test_a_handler_not_reading_stops_its_peer_sending(serve: Factory) -> None:
    served = await serve()
    raw = await Raw.open(served.port)
    sid = raw.request(b"/t.S/Lazy", b"first", end=False)
    assert await asyncio.wait_for(served.state.started.get(), WAIT) == "lazy"
    message = struct.pack(">BI", 0, 1019) + b"m" * 1019
    count, cap = 1 + (16 << 20) // len(message), 64 << 20
    blob, sent, pings = message * (count - 1), 0, 0
    while sent < cap:
        window = raw.h2.local_flow_control_window(sid)
        if window:
            n = min(window, 16_384, len(blob) - sent % len(blob))
            raw.h2.send_data(sid, blob[sent % len(blob):sent % len(blob) + n])
            sent += n
            raw.flush()
            await raw.writer.drain()
            continue
        # no window: whatever the server said before its PING ACK is in
        pings += 1
        raw.h2.ping(b"%08d" % pings)
        raw.flush()
        await raw.until(lambda es: len(of(es, ev.PingAckReceived)) == pings)
        if not raw.h2.local_flow_control_window(sid):
            break
    # the messages the handler has not read are bounded, not the whole 64 MiB sent
    assert sent < 4 << 20, sent  # 1 MiB unread, one 1 MiB window, the partial message
    served.state.release.set()  # the rest goes once the handler reads again
    total = len(blob)
    while sent < total:
        await raw.until(lambda es: raw.h2.local_flow_control_window(sid) > 0)
        n = min(raw.h2.local_flow_control_window(sid), 16_384, total - sent)
        raw.h2.send_data(sid, blob[sent:sent + n], end_stream=sent + n == total)
        sent += n
        raw.flush()
    events = await raw.until(lambda es: of(es, ev.StreamEnded))
    reply = b"".join(e.data for e in of(events, ev.DataReceived) if e.stream_id == sid)
    assert reply == struct.pack(">BI", 0, len(b"%d" % count)) + b"%d" % count
    assert await settle(lambda: served.open_calls() == 0)
    raw.close()


async def test_a_handler_writing_past_the_peer_window_waits_for_it(serve: Factory) -> None:
    served = await serve()
    raw = await Raw.open(served.port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    count = 20_000
    sid = raw.request(b"/t.S/Chunks", b"%d" % count)
    events = await raw.until(lambda es: of(es, ev.DataReceived))
    for _ in range(20):
        await asyncio.sleep(0)  # the handler's turns, were it not waiting
    # suspended in write() once the window was used, not queueing all it has to say
    assert served.state.yielded < 1000
    got = b""
    while not of(raw.events, ev.StreamEnded):
        for event in of(raw.events, ev.DataReceived):
            got += event.data
            raw.h2.acknowledge_received_data(event.flow_controlled_length, sid)
        raw.events = [e for e in raw.events if not isinstance(e, ev.DataReceived)]
        raw.flush()
        await raw.until(lambda es: of(es, ev.DataReceived) or of(es, ev.StreamEnded))
    got += b"".join(e.data for e in of(raw.events, ev.DataReceived))
    expected = b"".join(struct.pack(">BI", 0, len(b"%d" % i)) + b"%d" % i
                        for i in range(count))
    assert got == expected
    trailers = of(events + raw.events, ev.TrailersReceived)
    assert trailers[-1].headers == [(b"grpc-status", b"0")]
    assert await settle(lambda: served.open_calls() == 0)
    raw.close()


async def test_a_peer_not_reading_cannot_grow_the_servers_output(serve: Factory) -> None:
    served = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(f.PREFACE + f.settings({}))
    pings = f.frame(f.PING, 0, 0, b"12345678") * 4096  # 68 KiB; each PING asks for an ACK
    largest, sent = 0, 0
    try:
        while sent < 16 << 20:  # never reading what the server says
            writer.write(pings)
            sent += len(pings)
            await asyncio.wait_for(writer.drain(), 2)
            largest = max([largest] + [p.transport.get_write_buffer_size()
                                       for p in served.server.connections])
    except (asyncio.TimeoutError, ConnectionError, RuntimeError):  # (uvloop: a closed socket)
        pass  # it stopped reading us, or cut us: either way what it holds is bounded
    assert largest < 4 << 20, f"{largest} bytes of output held for a peer not reading"
    # cut as a flood (calm.py; what it said before, the kernel drops with the unread PINGs)
    assert await settle(lambda: not served.server.connections)
    writer.transport.abort()
    del reader


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 (openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


async def test_a_tls_handshake_ending_after_stop_is_not_served(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = Server(max_message=1 << 20)
    server.add_generic_rpc_handlers((handlers(State()),))
    port = await server.start("127.0.0.1:0", tls_context(str(cert), str(key)))
    client = ssl.create_default_context(cafile=str(cert))
    client.set_alpn_protocols(["h2"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    def step() -> bool:
        try:
            tls.do_handshake()
            return True
        except ssl.SSLWantReadError:
            return False
        finally:
            writer.write(outgoing.read())

    assert not step()  # ClientHello out
    incoming.write(await asyncio.wait_for(reader.read(65536), WAIT))  # the server's answer:
    await asyncio.wait_for(server.stop(1), WAIT)  # the connection is accepted, mid-handshake
    assert step()  # our Finished out: the server's side of the handshake can end
    received = b""
    try:
        while len(received) < f.HEADER_SIZE:  # the server's SETTINGS, were it served
            data = await asyncio.wait_for(reader.read(65536), WAIT)
            if not data:
                break
            incoming.write(data)
            try:
                plain = tls.read(65536)
            except ssl.SSLWantReadError:
                continue
            if not plain:
                break  # the server's close_notify
            received += plain
    except (ssl.SSLError, ConnectionError):
        pass
    writer.close()
    assert received == b"", "a connection served after stop() returned"
    assert not server.connections


async def test_an_over_limit_message_with_its_headers_leaves_no_call(serve: Factory) -> None:
    served = await serve(max_message=1024)
    raw = await Frames.open(served.port)
    # headers and the too-long message in one write: the call ends before its task ran
    raw.writer.write(f.frame(f.HEADERS, f.END_HEADERS, 1, raw.encoder.encode(REQUEST))
                     + f.frame(f.DATA, 0, 1, struct.pack(">BI", 0, 1025) + b"x" * 100))
    frames = await raw.until(lambda fs: kind(fs, f.RST_STREAM))
    trailers = hpack.Decoder().decode(kind(frames, f.HEADERS)[0][1])
    assert ("grpc-status", str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])) in trailers
    assert served.state.started.empty()
    assert await settle(lambda: served.open_calls() == 0)
    # and stop() has no call to wait for
    await asyncio.wait_for(served.server.stop(WAIT * 10), WAIT)
    raw.writer.close()


async def test_a_request_in_continuation_and_padded_frames_is_served(serve: Factory) -> None:
    served = await serve()
    raw = await Frames.open(served.port)
    fields = [(n, b"/t.S/Echo" if n == b":path" else v) for n, v in REQUEST]
    block = raw.encoder.encode(fields + [(b"x-filler", b"f" * 12_000)])
    message = struct.pack(">BI", 0, 6) + b"padded"
    raw.writer.write(
        f.frame(f.HEADERS, f.PADDED, 1, bytes((10,)) + block[:100] + b"\0" * 10)
        + f.frame(f.CONTINUATION, 0, 1, block[100:6_000])
        + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[6_000:])
        + f.frame(f.DATA, f.PADDED, 1, bytes((200,)) + message[:4] + b"\0" * 200)
        + f.frame(f.DATA, f.PADDED | f.END_STREAM, 1, bytes((0,)) + message[4:]))
    frames = await raw.until(lambda fs: any(k == f.HEADERS and fl & f.END_STREAM
                                            for k, fl, _s, _p in fs))
    assert b"".join(p for s, p in kind(frames, f.DATA) if s == 1) == message
    decoder = hpack.Decoder()
    blocks = [decoder.decode(p) for s, p in kind(frames, f.HEADERS)]
    assert blocks[-1] == [("grpc-status", "0")]
    assert await settle(lambda: served.open_calls() == 0)
    raw.writer.close()


async def test_grpc_message_is_percent_encoded_on_the_wire(serve: Factory) -> None:
    served = await serve()
    raw = await Frames.open(served.port)
    fields = [(n, b"/t.S/Abort" if n == b":path" else v) for n, v in REQUEST]
    details = "50% off ✓\n".encode()
    raw.writer.write(f.frame(f.HEADERS, f.END_HEADERS, 1, raw.encoder.encode(fields))
                     + f.frame(f.DATA, f.END_STREAM, 1,
                               struct.pack(">BI", 0, len(details)) + details))
    frames = await raw.until(lambda fs: kind(fs, f.HEADERS))
    trailers = dict(hpack.Decoder().decode(kind(frames, f.HEADERS)[0][1], raw=True))
    assert trailers[b":status"] == b"200"  # trailers-only: no message was sent
    assert trailers[b"grpc-status"] == b"%d" % grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert trailers[b"grpc-message"] == b"50%25 off %E2%9C%93%0A"
    raw.writer.close()


async def test_stop_cuts_the_calls_of_a_peer_not_reading(serve: Factory) -> None:
    served = await serve()
    raw = await Frames.open(served.port)
    raw.request(1, b"stuck")
    assert await asyncio.wait_for(served.state.started.get(), WAIT) == "stuck"
    # windows wide open, then a 32 MiB answer never read: more than the socket takes
    raw.writer.write(f.settings({f.INITIAL_WINDOW_SIZE: f.MAX_WINDOW})
                     + f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW))
    raw.request(3, b"%d" % (32 << 20), b"/t.S/Big")
    assert await settle(lambda: any(p.transport.get_write_buffer_size()
                                    for p in served.server.connections))
    await asyncio.wait_for(served.server.stop(0), WAIT)
    # cut when stop() returns, though the transport still waits to flush to the peer
    assert served.state.cancelled == ["stuck"] and served.state.finally_ran == ["stuck"]
    raw.writer.transport.abort()
