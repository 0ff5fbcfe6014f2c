"""One gRPC call on the native server: its messages in, the servicer context its handler is
given (the part of ``grpc.aio.ServicerContext`` the service's handlers use), its status out.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Any, Callable, Protocol

import grpc

from ..logs import Throttled, get_logger
from . import frames as f
from .connection import ServerConnection

log = get_logger(__name__)
_bad_messages = Throttled(log, "gRPC request message does not parse")


class Link(Protocol):
    """What a call needs of its connection (``server._Protocol``)."""

    loop: asyncio.AbstractEventLoop
    conn: ServerConnection
    calls: dict[int, "Call"]

    def schedule_flush(self) -> None:
        """Write what the connection has to send, later in this turn of the loop."""

    async def flushed(self) -> None:
        """Return once the transport takes more."""

    async def unblocked(self, sid: int) -> None:
        """Return once the stream's output no longer waits for the peer's windows."""

EOF = grpc.aio.EOF
_PREFIX = struct.Struct(">BI")
_SMALL_PART = 4096  # a part of a message below this size is copied into its neighbour
GRPC_CONTENT_TYPE = b"application/grpc"
_RESPONSE_HEAD = f.STATUS_200 + f.literal(b"content-type", GRPC_CONTENT_TYPE)
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


_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def deadline_of(value: bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` value (at most 8 digits and a unit), None if malformed."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _UNITS:
        return None
    return int(digits) * _UNITS[unit]


class Aborted(Exception):
    """Raised by ``Call.abort`` to unwind the handler (its status is already sent)."""


class Call:
    """One RPC: its incoming messages, and the servicer context its handler is given."""

    __slots__ = ("_protocol", "_sid", "_deserialize", "_serialize", "_messages", "_waiter",
                 "_parts", "_held", "_length", "_unread", "_owed", "_ended", "_headers_sent", "_finished",
                 "_callbacks", "_deadline", "unparsed", "task")

    def __init__(self, protocol: Link, sid: int, deserialize: Callable[[bytes], Any] | None,
                 serialize: Callable[[Any], bytes] | None) -> None:
        self._protocol, self._sid = protocol, sid
        self._deserialize, self._serialize = deserialize, serialize
        self._messages: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # A message still arriving: its parts as they came (joined once, when it is whole),
        # their size, and the message's length (-1 while its 5-byte prefix is split)
        self._parts: list[bytes | bytearray] = []
        self._held = 0
        self._length = -1
        self._unread = 0  # bytes in _messages
        self._owed = 0  # bytes received, not yet given back to the stream window
        self._ended = False
        self._headers_sent = False
        self._finished = False
        self._callbacks: list[Callable[[Any], None]] = []
        self._deadline: asyncio.TimerHandle | None = None
        self.unparsed = ""  # why the last message read did not parse ("": it did)
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
        if self._deserialize is None:
            return raw
        try:
            return self._deserialize(raw)
        except Exception as exc:
            # Raised to the handler, which may answer it its own way (the ext_proc service
            # counts it); one that does not is answered by ``unparsed``, not as a failure.
            self.unparsed = f"{type(exc).__name__}: {exc}"[:200]
            raise

    def answer_unparsed(self) -> None:
        """A handler let a message that does not parse escape: INTERNAL, and one throttled
        line without a traceback (a peer's garbage must not cost a trace per request)."""
        _bad_messages.warning(error=self.unparsed)
        self.finish(grpc.StatusCode.INTERNAL, "the request message does not parse")

    async def write(self, message: Any) -> None:
        """Send one response message."""
        if self._finished:
            return
        if isinstance(message, bytes):
            raw = message
        else:  # grpc's contract: a method registered without a serializer writes bytes
            assert self._serialize is not None, "no serializer for a message that is not bytes"
            raw = self._serialize(message)
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
        raise Aborted(details)

    def expire_after(self, seconds: float) -> None:
        """End the call with DEADLINE_EXCEEDED ``seconds`` from now (``grpc-timeout``)."""
        self._deadline = self._protocol.loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.finish(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        if self.task is not None:
            self.task.cancel()

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
        size = len(data)
        while data and not self._finished:
            data = self._gather(data) if self._parts else self._cut(data, limit)
        if self._finished:
            return
        self._owed += size
        if self._unread <= _UNREAD_LIMIT:  # (the caller, data_received, writes it out)
            self._give_back()
        if ended:
            self._ended = True
        if self._waiter is not None and not self._waiter.done() and (self._messages or ended):
            self._waiter.set_result(None)

    def _cut(self, data: bytes, limit: int) -> bytes:
        """Whole messages cut from ``data`` itself; the start of the next one kept in parts."""
        at, size = 0, len(data)
        while size - at >= 5:
            compressed, length = _PREFIX.unpack_from(data, at)
            if length > limit or compressed:
                self._refuse(length, limit)
                return b""
            if size - at - 5 < length:
                self._parts.append(data[at + 5:])
                self._held, self._length = size - at - 5, length
                return b""
            self._messages.append(data[at + 5:at + 5 + length])
            self._unread += length
            at += 5 + length
        if at < size:
            self._parts.append(data[at:])  # a prefix split over frames: _gather joins it
            self._length = -1
        return b""

    def _gather(self, data: bytes) -> bytes:
        """``data`` added to the message in parts; what follows the message it completes."""
        if self._length < 0:  # (fewer than 5 bytes held: the prefix, joined, is read anew)
            head = b"".join(self._parts) + data
            self._parts.clear()
            return head
        need = self._length - self._held
        if len(data) < need:
            self._keep(data)
            self._held += len(data)
            return b""
        # One copy of the whole message, however many frames it came in (growing a buffer per
        # frame and cutting the message from it copied each byte three times and more)
        self._parts.append(data[:need] if need < len(data) else data)
        self._messages.append(b"".join(self._parts))  # (bytes, even of one bytearray part)
        self._unread += self._length
        self._parts.clear()
        self._held = 0
        return data[need:]

    def _keep(self, data: bytes) -> None:
        # Small parts are gathered in one bytearray: a message in one-byte frames kept as a
        # list of objects would take eight times its size (a pointer each) and more
        last = self._parts[-1]
        if len(data) >= _SMALL_PART:
            self._parts.append(data)
        elif type(last) is bytearray:
            last += data
        else:
            self._parts.append(bytearray(data))

    def _refuse(self, length: int, limit: int) -> None:
        self.finish(grpc.StatusCode.RESOURCE_EXHAUSTED if length > limit
                    else grpc.StatusCode.UNIMPLEMENTED,
                    f"message of {length} bytes; the limit is {limit}" if length > limit
                    else "compressed messages are not supported")
        self.cancel()
        self._parts.clear()

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
        if self._deadline is not None:
            self._deadline.cancel()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # run where the connection reads: raised, it would cut it
                log.error("gRPC done callback failed", exc_info=True)
