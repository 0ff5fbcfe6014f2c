"""gRPC over ``connection.ServerConnection`` on asyncio: one protocol object per connection,
one task per call (the listener that accepts them is ``listener.Server``).

Each call gets a context with the part of ``grpc.aio.ServicerContext`` the service's handlers
use: ``read``, ``write``, ``abort``, ``add_done_callback``. What one turn of the loop writes,
over every call of a connection, leaves in one ``write``.

What one peer may cost the others is bounded: a connection's frames are read at most
``FRAMES_PER_TURN`` per turn of the loop (its socket is not read meanwhile), a connection that
does not complete its handshake within ``HANDSHAKE_TIMEOUT`` is closed, one idle past the idle
timeout is drained, and past ``max_connections`` a new connection takes the place of an idle
one (``admission.py``), or is refused with a warning when none is idle.

Not served: message compression (no ``grpc-encoding``; Envoy does not compress ext_proc),
and HTTP/2 server push.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Protocol

import grpc

from ..logs import Throttled, get_logger
from . import frames as f
from .connection_cap import ConnectionCap
from .call import EOF, GRPC_CONTENT_TYPE, Aborted, Call, deadline_of
from .connection import ServerConnection
from .h2events import Closed, Data, Request, Reset

log = get_logger(__name__)
_peer_errors = Throttled(log, "HTTP/2 connection error from the peer")
_over_cap = Throttled(log, "gRPC connection refused: --max-connections (or the share of one "
                      "peer) reached, and every connection held has streams open")

# Frames read from one connection per turn of the event loop, at most: ~1 ms of work, so a
# peer's flood of small frames (256 KiB a read under uvloop is ~10,000 of them) cannot hold
# every other connection's turn.
FRAMES_PER_TURN = 256
# Calls of a lost connection cancelled per turn of the loop
CANCELS_PER_TURN = 256
# Seconds a new connection has to send its preface and acknowledge our SETTINGS (§6.5.3).
HANDSHAKE_TIMEOUT = 10.0


class Host(Protocol):
    """What a connection needs of the server that accepted it (``listener.Server``)."""

    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    stopping: bool
    max_message: int
    max_concurrent_streams: int
    admission: ConnectionCap
    idle_timeout: float
    live_calls: int  # handlers running, over every connection (lost ones' still unwinding)

    def method(self, path: str) -> Any:
        """The handler of ``path``, or None."""


class _Protocol(asyncio.Protocol):
    """One HTTP/2 connection: frames in, calls started, frames out."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.loop = server.loop
        self.conn = ServerConnection(max_concurrent_streams=server.max_concurrent_streams)
        self.calls: dict[int, Call] = {}
        # Streams that are not gRPC, answered 415 once the peer has sent them whole: their
        # data is taken and dropped meanwhile (the stream limit bounds how many).
        self._refusing: set[int] = set()
        self.transport: asyncio.Transport | None = None
        self._flush_due = False
        self._writable: asyncio.Future[None] | None = None
        self._stalled: dict[int, asyncio.Future[None]] = {}  # streams waiting on the peer
        self._backlog = False  # frames wait in the connection: reading is paused for them
        self._starting: list[tuple[Call, Any]] = []  # calls of this read, their tasks not made
        self._busy_at = self.loop.time()  # when a stream was last open
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self.peer = ""  # the peer's address (its host: its connections share a part of the cap)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.server.stopping:  # accepted before stop(), its TLS handshake ending after it:
            transport.close()  # stop() did not see it, so it would be served on after stop()
            return
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else ""
        if not self.server.admission.admit(self):
            _over_cap.warning(connections=len(self.server.admission))
            transport.abort()  # type: ignore[attr-defined]  # a stream transport's
            return
        self.server.connections.add(self)
        self._handshake_timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._check_handshake)
        if self.server.idle_timeout:
            self._idle_timer = self.loop.call_later(self.server.idle_timeout / 4,
                                                    self._check_idle)
        self.schedule_flush()  # our SETTINGS

    def _check_handshake(self) -> None:
        if not self.conn.preface_received or not self.conn.settings_acked:
            _peer_errors.warning(error="no HTTP/2 preface or SETTINGS ACK within "
                                 f"{HANDSHAKE_TIMEOUT:g}s")
            self.close()

    def _check_idle(self) -> None:
        now = self.loop.time()
        if self.calls or self.conn.open_streams:
            self._busy_at = now
        elif now - self._busy_at >= self.server.idle_timeout:
            if self.conn.draining:  # the notice went out a quarter timeout ago, no ACK came
                self.conn.goaway()
            else:
                self.conn.drain()
            self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self._idle_timer = self.loop.call_later(self.server.idle_timeout / 4,
                                                    self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._take(data)

    def _take(self, data: bytes) -> None:
        """Read what the connection holds, a turn's worth of frames at most (the rest on a
        later turn, the socket not read meanwhile)."""
        if self.transport is None or self.transport.is_closing():
            return
        limit = self.server.max_message
        self._starting = []
        for event in self.conn.receive(data, FRAMES_PER_TURN):
            if type(event) is Data:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.feed(event.data, event.ended, limit)
                elif event.stream_id in self._refusing:
                    self._drop(event)
            elif type(event) is Request:
                self._start(event)
            elif type(event) is Reset:
                self._refusing.discard(event.stream_id)
                call = self.calls.pop(event.stream_id, None)
                if call is not None:
                    call.cancel()
            elif type(event) is Closed:
                _peer_errors.warning(error=event.why)
        # Handlers start once the read is taken: a stream its peer reset in the same read (rapid
        # reset sends HEADERS and RST_STREAM together) never costs a task
        for call, method in self._starting:
            if self.calls.get(call._sid) is call:  # noqa: SLF001 (the protocol owns its calls)
                call.task = self.loop.create_task(self._run(call, method))
                self.server.live_calls += 1  # (a task cancelled before it ran runs no
                call.task.add_done_callback(self._call_done)  # finally: counted when done)
        self._starting = []
        if self._stalled:  # a WINDOW_UPDATE or SETTINGS may have let their output go
            self._wake(lambda sid: not self.conn.blocked(sid))
        if self.conn.backlog:
            if not self._backlog:
                self._backlog = True
                self.transport.pause_reading()
            self.loop.call_soon(self._take, b"")
        elif self._backlog:
            self._backlog = False
            if self._writable is None:  # (else resume_writing resumes it)
                self.transport.resume_reading()
        self._note()
        self._flush()

    def _note(self) -> None:
        """Tell admission whether the connection is past its preface, and busy."""
        self.server.admission.note(self, self.conn.preface_received,
                                   bool(self.calls or self.conn.open_streams))

    def _start(self, request: Request) -> None:
        sid = request.stream_id
        path = content_type = timeout = b""
        for name, value in request.headers:
            if name == b":path":
                path = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
        if not content_type.startswith(GRPC_CONTENT_TYPE):
            if request.ended:
                self._refuse(sid)
            else:
                self._refusing.add(sid)
            return
        method = self.server.method(path.decode("latin-1"))
        call = Call(self, sid, method and method.request_deserializer,
                    method and method.response_serializer)
        if method is None:
            call.finish(grpc.StatusCode.UNIMPLEMENTED, f"method {path.decode('latin-1')} "
                        "is not served here")
            return
        if timeout:
            seconds = deadline_of(timeout)
            if seconds is None:
                call.finish(grpc.StatusCode.INTERNAL, "malformed grpc-timeout")
                return
            call.expire_after(seconds)
        self.calls[sid] = call
        if request.ended:
            call.feed(b"", True, 0)
        self._starting.append((call, method))

    def _refuse(self, sid: int) -> None:
        """Not gRPC: 415, trailers-only."""
        self.conn.send_headers(sid, f.literal(b":status", b"415"), end_stream=True)

    def _drop(self, event: Data) -> None:
        """A non-gRPC stream's data: taken (its window given back), then the 415 at its end."""
        self.conn.consumed(event.stream_id, len(event.data))
        if event.ended:
            self._refusing.discard(event.stream_id)
            self._refuse(event.stream_id)

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
        except Aborted:
            pass
        except asyncio.CancelledError:
            call.cancel()  # reset by the peer, or the server stopping: no status to send
        except Exception:
            if call.unparsed:
                call.answer_unparsed()
            else:
                log.error("gRPC handler failed", exc_info=True)
                call.finish(grpc.StatusCode.UNKNOWN, "handler failed")
        finally:
            self.calls.pop(call._sid, None)  # noqa: SLF001 (the protocol owns its calls)
            if not self.calls:
                self._note()

    def _call_done(self, _task: asyncio.Task[None]) -> None:
        self.server.live_calls -= 1

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
        if self.transport is None or self.transport.is_closing():
            return
        if data:
            self.transport.write(data)
        if self.conn.closed or self.conn.drained:  # (the transport sends what it holds first)
            self.transport.close()

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
        if self.transport is not None and not self.transport.is_closing() and not self._backlog:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.admission.leave(self)
        for timer in (self._handshake_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self.resume_writing()
        self._wake(lambda sid: True)
        calls, self.calls = list(self.calls.values()), {}
        self._cancel(calls)

    def _cancel(self, calls: list[Call]) -> None:
        """Cancel the calls of a lost connection a turn's worth at a time: 20,000 at once held
        the loop ~200 ms (each runs its handler's accounting)."""
        for call in calls[:CANCELS_PER_TURN]:
            call.cancel()
        if len(calls) > CANCELS_PER_TURN:
            self.loop.call_soon(self._cancel, calls[CANCELS_PER_TURN:])

    def goaway(self) -> None:
        """Stop taking new calls on this connection."""
        self.conn.goaway()
        self._flush()

    def evict(self) -> None:
        """Close the connection to make room for a new one (it is idle): GOAWAY, then the
        socket."""
        self.server.connections.discard(self)
        self.goaway()  # (which closes the socket once said: no stream is open)
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now, whatever is left unsent."""
        self.server.connections.discard(self)
        self.server.admission.leave(self)
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Cut the connection (and with it every call still open)."""
        if self.transport is not None:
            self.transport.close()
        # Now, not at connection_lost: the transport first flushes what it holds, and a peer
        # not reading would keep these calls running after stop().
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()
