"""gRPC over ``connection.ServerConnection`` on asyncio: the listener, one protocol object per
connection, one task per call.

It takes the handlers grpc.aio takes (``add_generic_rpc_handlers``,
``add_registered_method_handlers``: the ext_proc service and ``grpc.health.v1`` register
unchanged), and gives each call a context with the part of ``grpc.aio.ServicerContext``
they use: ``read``, ``write``, ``abort``, ``add_done_callback``. What one turn of the loop
writes, over every call of a connection, leaves in one ``write``.

Not served: message compression (no ``grpc-encoding``; Envoy does not compress ext_proc),
and HTTP/2 server push. TLS is the listener's (``ssl`` with ALPN ``h2``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ssl
import struct
from collections import deque
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import grpc

from ...logs import get_logger
from . import frames as f
from .connection import Closed, Data, Request, Reset, ServerConnection

log = get_logger(__name__)

EOF = grpc.aio.EOF
_PREFIX = struct.Struct(">BI")
_GRPC = b"application/grpc"
_RESPONSE_HEAD = f.STATUS_200 + f.literal(b"content-type", _GRPC)
_OK_TRAILERS = f.literal(b"grpc-status", b"0")
#: Bytes of whole messages a handler has not read yet past which its stream's window is no
#: longer given back: the peer then stops after one more window, instead of this side
#: buffering whatever it sends.
_UNREAD_LIMIT = 1 << 20


def _trailers(code: grpc.StatusCode, message: str) -> bytes:
    if code is grpc.StatusCode.OK and not message:
        return _OK_TRAILERS
    block = f.literal(b"grpc-status", str(code.value[0]).encode())
    if message:  # percent-encoded (gRPC over HTTP/2: grpc-message)
        encoded = "".join(c if " " <= c <= "~" and c != "%" else
                          "".join(f"%{b:02X}" for b in c.encode()) for c in message)
        block += f.literal(b"grpc-message", encoded.encode("ascii"))
    return block


class _Details(NamedTuple):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


class _Aborted(Exception):
    """Raised by ``Call.abort`` to unwind the handler (its status is already sent)."""


class Call:
    """One RPC: its incoming messages, and the servicer context its handler is given."""

    __slots__ = ("_protocol", "_sid", "_deserialize", "_serialize", "_messages", "_waiter",
                 "_buffer", "_unread", "_owed", "_ended", "_headers_sent", "_finished",
                 "_callbacks", "task")

    def __init__(self, protocol: "_Protocol", sid: int, deserialize: Callable | None,
                 serialize: Callable | None) -> None:
        self._protocol, self._sid = protocol, sid
        self._deserialize, self._serialize = deserialize, serialize
        self._messages: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._buffer = b""
        self._unread = 0  # bytes in _messages
        self._owed = 0  # bytes received, not yet given back to the stream window
        self._ended = False
        self._headers_sent = False
        self._finished = False
        self._callbacks: list[Callable[[Any], None]] = []
        self.task: asyncio.Task[None] | None = None

    # ---- the servicer context --------------------------------------------------------------

    async def read(self) -> Any:
        """The next request message, or ``EOF`` once the peer has ended its side."""
        while not self._messages:
            if self._ended:
                return EOF
            self._waiter = self._protocol.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        raw = self._messages.popleft()
        self._unread -= len(raw)
        if self._owed and self._unread <= _UNREAD_LIMIT:
            self._give_back()
            self._protocol.schedule_flush()
        return self._deserialize(raw) if self._deserialize is not None else raw

    async def write(self, message: Any) -> None:
        """Send one response message."""
        if self._finished:
            return
        raw = message if isinstance(message, bytes) else self._serialize(message)
        conn = self._protocol.conn
        if not self._headers_sent:
            self._headers_sent = True
            conn.send_headers(self._sid, _RESPONSE_HEAD)
        conn.send_data(self._sid, _PREFIX.pack(0, len(raw)) + raw)
        if conn.blocked(self._sid):  # the peer reads slower: wait, as grpc.aio does, not queue
            await self._protocol.unblocked(self._sid)
        await self._protocol.flushed()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """End the call with ``code`` and unwind the handler."""
        self.finish(code, details)
        raise _Aborted(details)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(self)`` when the call ends, however it ends."""
        if self._finished:
            callback(self)
        else:
            self._callbacks.append(callback)

    def __aiter__(self) -> "Call":
        return self

    async def __anext__(self) -> Any:
        message = await self.read()
        if message is EOF:
            raise StopAsyncIteration
        return message

    # ---- the connection's side -------------------------------------------------------------

    def feed(self, data: bytes, ended: bool, limit: int) -> None:
        """Bytes of the request stream; whole messages become readable."""
        if self._finished:
            return  # its status is said: nothing more to read (nor to keep)
        buffer = self._buffer + data if self._buffer else data
        at = 0
        while len(buffer) - at >= 5:
            compressed, length = _PREFIX.unpack_from(buffer, at)
            if length > limit or compressed:
                self.finish(grpc.StatusCode.RESOURCE_EXHAUSTED if length > limit
                            else grpc.StatusCode.UNIMPLEMENTED,
                            f"message of {length} bytes; the limit is {limit}" if length > limit
                            else "compressed messages are not supported")
                self.cancel()
                return
            if len(buffer) - at - 5 < length:
                break
            self._messages.append(buffer[at + 5:at + 5 + length])
            self._unread += length
            at += 5 + length
        self._buffer = buffer[at:] if at < len(buffer) else b""
        self._owed += len(data)
        if self._unread <= _UNREAD_LIMIT:  # (the caller, data_received, writes it out)
            self._give_back()
        if ended:
            self._ended = True
        if self._waiter is not None and not self._waiter.done() and (self._messages or ended):
            self._waiter.set_result(None)

    def _give_back(self) -> None:
        self._protocol.conn.consumed(self._sid, self._owed)
        self._owed = 0

    def finish(self, code: grpc.StatusCode, message: str = "") -> None:
        """Send the call's status (trailers) once; later calls do nothing."""
        if self._finished:
            return
        self._finished = True
        conn = self._protocol.conn
        trailers = _trailers(code, message)
        if not self._headers_sent:  # trailers-only response
            trailers = _RESPONSE_HEAD + trailers
        conn.send_headers(self._sid, trailers, end_stream=True)
        conn.finish(self._sid)
        self._protocol.schedule_flush()
        self._done()

    def cancel(self) -> None:
        """The call is over without a status (reset, lost connection, server stop)."""
        if not self._finished:  # a handler's own CancelledError: no status will come, and
            self._protocol.conn.reset(self._sid)  # the peer must not wait for one
            self._protocol.schedule_flush()
        self._finished = True
        # A task cancelled before its first step never runs _run's finally: the call would
        # stay in calls (and stop() would wait out its grace for it).
        self._protocol.calls.pop(self._sid, None)
        self._done()
        if self.task is not None:
            self.task.cancel()

    def _done(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # run where the connection reads: raised, it would cut it
                log.error("gRPC done callback failed", exc_info=True)


class _Protocol(asyncio.Protocol):
    """One HTTP/2 connection: frames in, calls started, frames out."""

    def __init__(self, server: "Server") -> None:
        self.server = server
        self.loop = server.loop
        self.conn = ServerConnection(max_concurrent_streams=server.max_concurrent_streams)
        self.calls: dict[int, Call] = {}
        self.transport: asyncio.Transport | None = None
        self._flush_due = False
        self._writable: asyncio.Future[None] | None = None
        self._stalled: dict[int, asyncio.Future[None]] = {}  # streams waiting on the peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.server.stopping:  # accepted before stop(), its TLS handshake ending after it:
            transport.close()  # stop() did not see it, so it would be served on after stop()
            return
        self.server.connections.add(self)
        self.schedule_flush()  # our SETTINGS

    def data_received(self, data: bytes) -> None:
        limit = self.server.max_message
        for event in self.conn.receive(data):
            if type(event) is Data:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.feed(event.data, event.ended, limit)
            elif type(event) is Request:
                self._start(event)
            elif type(event) is Reset:
                call = self.calls.pop(event.stream_id, None)
                if call is not None:
                    call.cancel()
            elif type(event) is Closed:
                log.warning("HTTP/2 connection error from the peer", error=event.why)
        if self._stalled:  # a WINDOW_UPDATE or SETTINGS may have let their output go
            self._wake(lambda sid: not self.conn.blocked(sid))
        self._flush()
        if self.conn.closed and self.transport is not None:
            self.transport.close()

    def _start(self, request: Request) -> None:
        sid = request.stream_id
        path = content_type = b""
        for name, value in request.headers:
            if name == b":path":
                path = value
            elif name == b"content-type":
                content_type = value
        if not content_type.startswith(_GRPC):
            self.conn.send_headers(sid, f.literal(b":status", b"415"), end_stream=True)
            self.conn.finish(sid)
            return
        method = self.server.method(path.decode("latin-1"))
        call = Call(self, sid, method and method.request_deserializer,
                    method and method.response_serializer)
        if method is None:
            call.finish(grpc.StatusCode.UNIMPLEMENTED, f"method {path.decode('latin-1')} "
                        "is not served here")
            return
        self.calls[sid] = call
        if request.ended:
            call.feed(b"", True, 0)
        call.task = self.loop.create_task(self._run(call, method))

    async def _run(self, call: Call, method: Any) -> None:
        try:
            if method.request_streaming:
                behaviour = method.stream_stream or method.stream_unary
                result = behaviour(call, call)
            else:
                request = await call.read()
                if request is EOF:
                    return call.finish(grpc.StatusCode.INTERNAL, "no request message")
                behaviour = method.unary_unary or method.unary_stream
                result = behaviour(request, call)
            if inspect.isasyncgen(result):
                async for response in result:
                    await call.write(response)
            else:
                response = await result if inspect.isawaitable(result) else result
                if response is not None and not method.response_streaming:
                    await call.write(response)
            call.finish(grpc.StatusCode.OK)
        except _Aborted:
            pass
        except asyncio.CancelledError:
            call.cancel()  # reset by the peer, or the server stopping: no status to send
        except Exception:
            log.error("gRPC handler failed", exc_info=True)
            call.finish(grpc.StatusCode.UNKNOWN, "handler failed")
        finally:
            self.calls.pop(call._sid, None)  # noqa: SLF001 (the protocol owns its calls)

    async def unblocked(self, sid: int) -> None:
        """Return once the stream's output no longer waits for the peer's windows (or the
        stream, or the connection, is gone)."""
        self.schedule_flush()
        waiter = self._stalled.get(sid)
        if waiter is None:
            waiter = self._stalled[sid] = self.loop.create_future()
        await waiter  # (a cancelled one stays in _stalled until its stream is gone or free)

    def _wake(self, which: Callable[[int], bool]) -> None:
        for sid in [sid for sid in self._stalled if which(sid)]:
            waiter = self._stalled.pop(sid)
            if not waiter.done():
                waiter.set_result(None)

    def schedule_flush(self) -> None:
        """Write what the connection has to send, once, later in this turn of the loop."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def flushed(self) -> None:
        """Return once the transport takes more (at once unless Envoy reads slower)."""
        self.schedule_flush()
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()
        if self.transport is not None:  # else each PING, SETTINGS... of a peer not reading
            self.transport.pause_reading()  # adds its answer to what we hold, without bound

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.resume_writing()
        self._wake(lambda sid: True)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()

    def goaway(self) -> None:
        """Stop taking new calls on this connection."""
        self.conn.goaway()
        self._flush()

    def close(self) -> None:
        """Cut the connection (and with it every call still open)."""
        if self.transport is not None:
            self.transport.close()
        # Now, not at connection_lost: the transport first flushes what it holds, and a peer
        # not reading would keep these calls running after stop().
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()


class Server:
    """A gRPC server on the event loop, with grpc.aio.Server's registration and stop()."""

    def __init__(self, *, max_message: int, max_concurrent_streams: int = 1 << 20) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_message = max_message
        self.max_concurrent_streams = max_concurrent_streams
        self.connections: set[_Protocol] = set()
        self.stopping = False  # stop() has begun: a connection made now is closed at once
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        self._listeners: list[asyncio.AbstractServer] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Serve these handlers (as grpc.aio.Server does)."""
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Serve these methods of ``service`` (as grpc.aio.Server does)."""
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def method(self, path: str) -> Any:
        """The handler of ``path`` (``/package.Service/Method``), or None."""
        if path in self._methods:
            return self._methods[path]
        found = self._registered.get(path)
        for generic in self._generic:
            if found is not None:
                break
            found = generic.service(_Details(path, ()))
        if len(self._methods) < 64:  # bounded: a peer could name endless methods
            self._methods[path] = found
        return found

    async def start(self, listen: str, tls: ssl.SSLContext | None = None) -> int:
        """Listen on ``host:port`` or ``unix:PATH``; the bound TCP port (0 for a socket)."""
        if listen.startswith("unix:"):
            path = listen[len("unix:"):].removeprefix("//")
            with contextlib.suppress(FileNotFoundError):
                Path(path).unlink()  # a socket left by an earlier process
            listener = await self.loop.create_unix_server(lambda: _Protocol(self), path,
                                                          ssl=tls, backlog=4096)
            self._listeners.append(listener)
            return 0
        host, _, port = listen.rpartition(":")
        listener = await self.loop.create_server(lambda: _Protocol(self), host.strip("[]"),
                                                 int(port), ssl=tls, backlog=4096,
                                                 reuse_address=True)
        self._listeners.append(listener)
        return listener.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None) -> None:
        """Take no new calls; give open ones ``grace`` seconds, then cut them."""
        self.stopping = True
        for listener in self._listeners:
            listener.close()
        for protocol in list(self.connections):
            protocol.goaway()
        if grace:
            deadline = self.loop.time() + grace
            while any(p.calls for p in self.connections) and self.loop.time() < deadline:
                await asyncio.sleep(0.05)
        tasks = [c.task for p in self.connections for c in p.calls.values() if c.task]
        for protocol in list(self.connections):
            protocol.close()
        for listener in self._listeners:
            await listener.wait_closed()
        if tasks:  # the cut calls' handlers unwind (their accounting runs) before we return
            await asyncio.wait(tasks, timeout=5)


def tls_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """A server TLS context offering h2 (ALPN); clients must present a certificate signed by
    ``client_ca`` when it is given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
