"""The server side of one HTTP/2 connection, without I/O (the way h11 keeps HTTP/1.1).

Bytes go in through ``receive``, which returns what happened (``Request``, ``Data``,
``Reset``, ``Closed``); what the server says goes out through ``send_headers``, ``send_data``,
``reset`` and ``goaway`` (``sending.py``), and ``data_to_send`` hands over the bytes. Frames,
stream states (RFC 9113 §5.1) and the receive windows are kept here, control frames and the
peer's budgets in ``control.py``: the asyncio side (``server.py``) only moves bytes.

The connection's receive window is replenished as data arrives, a stream's once the
application says it has taken the data (``consumed``): a handler that does not read stops its
peer after one stream window. ``receive`` does at most ``max_frames`` frames' work per call
(``backlog`` then says more may wait), so one connection cannot hold the event loop.
"""

from __future__ import annotations

import time
from typing import Callable

from . import frames as f
from .calm import Calm
from .h2events import Closed, ConnectionError_, Data, Event, Request, Reset
from .headerblocks import DecodingError, HeaderBlocks, TooManyFields
from .control import (DECODED_BYTES_PER_FRAME, DECODED_FIELD_FRAMES, DRAIN_PING,
                      NEW_STREAM_FRAMES, U32, Control)
from .limits import (CLOSED_KEPT, DECODED_SLACK, FIELDS_DECODED, MAX_CONTINUATIONS,
                     MAX_HEADER_FIELDS, MAX_HEADER_LIST, UNACKED_STREAMS)
from .headercheck import content_length, malformed
from .sending import StreamState

__all__ = ["MAX_CONTINUATIONS", "MAX_HEADER_FIELDS", "MAX_HEADER_LIST", "FIELDS_DECODED",
           "UNACKED_STREAMS", "ServerConnection"]

_TOO_LARGE = f.literal(b":status", b"431")  # Request Header Fields Too Large
# Frames that serve no request: each draws on the control budget (DATA when empty, RST_STREAM
# when its stream is closed, HEADERS when refused, and unknown types, are counted where known)
_CONTROL = frozenset({f.PRIORITY, f.SETTINGS, f.PING, f.GOAWAY, f.WINDOW_UPDATE})


class ServerConnection(Control):
    """One HTTP/2 connection's state, from the server's side."""

    def __init__(self, *, max_concurrent_streams: int = 1 << 20,
                 initial_window: int = 1 << 20, connection_window: int = 16 << 20,
                 max_header_list_size: int = MAX_HEADER_LIST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._inbox = bytearray()
        self._preface = False
        self.settings_acked = False  # the peer has acknowledged our SETTINGS (§6.5.3)
        self.backlog = False  # whole frames wait in the inbox: call receive(b"") again
        self._out = bytearray()
        self._calm = Calm(clock)
        self._clock = clock
        self._max_list = max_header_list_size
        self._blocks = HeaderBlocks(DECODED_SLACK * max_header_list_size, FIELDS_DECODED)
        # An encoded block is no longer than the list it decodes to (each field counts 32
        # bytes more there); twice that leaves room for odd encoders. Without a bound, a peer
        # sending CONTINUATION frames without END_HEADERS grows the block for ever.
        self._max_block = 2 * max_header_list_size
        self._max_streams = max_concurrent_streams
        self._initial_recv = initial_window
        # Frames of RFC 9113's default size at most (16 KiB): a frame still arriving waits
        # whole in the inbox, and Envoy sends no larger ones anyway.
        self._max_frame = f.DEFAULT_FRAME_SIZE
        self._conn_recv_full = self._conn_recv = connection_window
        self._peer_initial = f.DEFAULT_WINDOW
        self._peer_frame = f.DEFAULT_FRAME_SIZE
        self._conn_send = f.DEFAULT_WINDOW
        self._streams: dict[int, StreamState] = {}
        # Streams with pending output: waiting for the connection's window (their own has
        # room), or starved of their own. Only a frame that can free a stream visits it, so
        # the work per SETTINGS or WINDOW_UPDATE does not grow with the streams that wait.
        self._blocked: set[int] = set()
        self._starved: set[int] = set()
        self._last_stream = 0
        self._closed: dict[int, bool] = {}  # the last CLOSED_KEPT closed streams: reset by us?
        self._closed_before = 0  # the highest stream the record has let go
        self._block: tuple[int, int, bytearray] | None = None  # (stream, flags, fragments)
        self._block_frames = 0  # CONTINUATION frames of the block so far
        self._size_update_due = True
        self._goaway_at: int | None = None  # the last stream accepted once GOAWAY was sent
        self._draining: tuple[int, float] | None = None  # (code, since): a notice went out
        # What this read may still do, in frames: a frame that costs more than its count (a
        # SETTINGS of many entries, a header block decoded anew) draws more (_work)
        self._turn_left = 0
        self._debt = 0  # work done past a turn's share, taken from the turns that follow
        self.closed = False
        self._out += f.settings({f.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
                                 f.INITIAL_WINDOW_SIZE: initial_window,
                                 f.MAX_HEADER_LIST_SIZE: max_header_list_size,
                                 f.ENABLE_PUSH: 0})
        if connection_window > f.DEFAULT_WINDOW:
            self._out += f.window_update(0, connection_window - f.DEFAULT_WINDOW)

    @property
    def open_streams(self) -> int:
        """Streams not yet closed on both sides."""
        return len(self._streams)

    @property
    def preface_received(self) -> bool:
        """Whether the peer's connection preface has arrived."""
        return self._preface

    @property
    def draining(self) -> bool:
        """Whether a drain notice went out and its final GOAWAY has not yet."""
        return self._draining is not None and self._goaway_at is None

    @property
    def drained(self) -> bool:
        """Whether a GOAWAY has been said and no stream is left: the connection may close."""
        return self._goaway_at is not None and not self._streams

    def data_to_send(self) -> bytes:
        """The bytes to write now (and forget here)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    # ---- receiving -------------------------------------------------------------------------

    def receive(self, data: bytes, max_frames: int = 0) -> list[Event]:
        """Take bytes from the peer; the events they complete, from at most ``max_frames``
        frames when it is not 0 (``backlog`` then says whether more may wait)."""
        self.backlog = False
        if self.closed:
            return []
        events: list[Event] = []
        try:
            if not self._preface:
                self._inbox += data
                data = b""
                if not f.PREFACE.startswith(bytes(self._inbox[:len(f.PREFACE)])):
                    raise ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 preface")
                if len(self._inbox) < len(f.PREFACE):
                    return events
                del self._inbox[:len(f.PREFACE)]
                self._preface = True
            # Frames are cut from the read itself when nothing is left over from the last one,
            # each payload copied once, through a view (a bytearray's slice copies twice)
            if self._inbox:
                self._inbox += data
            inbox: bytes | bytearray = self._inbox or data
            at = 0
            # a turn that did more than its share (one large header block) is paid for by the
            # next ones: the connection waits its turns out, the others go meanwhile
            self._turn_left = max_frames - self._debt if max_frames else -1
            with memoryview(inbox) as view:
                while len(inbox) - at >= f.HEADER_SIZE:
                    if self._turn_left <= 0 and max_frames:
                        self.backlog = True
                        break
                    self._turn_left -= 1
                    first, flags, stream_id = f.HEADER.unpack_from(inbox, at)
                    length, kind = first >> 8, first & 0xFF
                    if length > self._max_frame:
                        raise ConnectionError_(f.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                    end = at + f.HEADER_SIZE + length
                    if end > len(inbox):
                        break
                    payload = bytes(view[at + f.HEADER_SIZE:end])
                    at = end
                    self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload, events)
            if max_frames:
                self._debt = max(0, -self._turn_left)
            if inbox is self._inbox:
                del self._inbox[:at]
            else:
                self._inbox += inbox[at:]  # (a frame's start, or the turn's rest)
        except ConnectionError_ as exc:
            self._out += f.goaway(self._last_stream, exc.code, exc.why.encode()[:256])
            self.closed = True
            events.append(Closed(exc.code, exc.why))
        return events

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if self._block is not None and (kind != f.CONTINUATION or sid != self._block[0]):
            raise ConnectionError_(f.PROTOCOL_ERROR, "header block interrupted")
        if kind > f.CONTINUATION or kind in _CONTROL:
            self._control()
        if kind == f.DATA:
            self._data(flags, sid, payload, events)
        elif kind == f.HEADERS:
            self._headers(flags, sid, payload, events)
        elif kind == f.CONTINUATION:
            if self._block is None:
                raise ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self._block[2].extend(payload)
            self._block_frames += 1
            if len(self._block[2]) > self._max_block:
                raise ConnectionError_(f.PROTOCOL_ERROR,
                                       f"header block over {self._max_block} bytes")
            if self._block_frames > MAX_CONTINUATIONS:
                # empty CONTINUATIONs pass the byte bound for ever: bound their number too
                raise ConnectionError_(f.ENHANCE_YOUR_CALM,
                                       f"header block in over {MAX_CONTINUATIONS} frames")
            if flags & f.END_HEADERS:
                block_sid, block_flags, fragments = self._block
                self._block = None
                self._header_block(block_sid, block_flags, bytes(fragments), events)
        elif kind == f.SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, payload, events)
        elif kind == f.PING:
            if sid or len(payload) != 8:
                raise ConnectionError_(f.PROTOCOL_ERROR, "malformed PING")
            if not flags & f.ACK:
                self._out += f.frame(f.PING, f.ACK, 0, payload)
            elif payload == DRAIN_PING and self._draining is not None:
                self.goaway(self._draining[0])  # it has seen the notice: the final GOAWAY
        elif kind == f.RST_STREAM:
            if not sid or len(payload) != 4:
                raise ConnectionError_(f.PROTOCOL_ERROR, "malformed RST_STREAM")
            if sid > self._last_stream:
                raise ConnectionError_(f.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            if self._forget(sid):
                events.append(Reset(sid, U32.unpack(payload)[0]))
                self._peer_reset()
            else:
                self._control()  # a reset of a closed stream serves nothing
        elif kind == f.GOAWAY:
            # the peer opens no more streams; the open ones run to their end
            if sid:
                raise ConnectionError_(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(f.PROTOCOL_ERROR, "a client cannot push")
        elif kind == f.PRIORITY:
            if not sid:
                raise ConnectionError_(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error(sid, f.FRAME_SIZE_ERROR, events)  # §6.3
            elif U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
                self._stream_error(sid, f.PROTOCOL_ERROR, events)  # §5.3.1: on itself
        # other types: ignored (§4.1, extensions)

    def _data(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not sid:
            raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if not size and not flags & f.END_STREAM:
            self._control()  # an empty DATA frame moves nothing
        self._conn_recv -= size
        if self._conn_recv < 0:
            raise ConnectionError_(f.FLOW_CONTROL_ERROR, "connection window exceeded")
        if self._conn_recv < self._conn_recv_full // 2:
            self._out += f.window_update(0, self._conn_recv_full - self._conn_recv)
            self._conn_recv = self._conn_recv_full
        stream = self._streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self._last_stream:
                raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on an idle stream")
            self._control()
            self._after_close(sid, stream, events)
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset(sid, f.FLOW_CONTROL_ERROR)
            events.append(Reset(sid, f.FLOW_CONTROL_ERROR))
            return
        ended = bool(flags & f.END_STREAM)
        data = f.unpadded(flags, payload)
        if stream.length_left is not None:
            stream.length_left -= len(data)
            if stream.length_left < 0 or (ended and stream.length_left):
                self._stream_error(sid, f.PROTOCOL_ERROR, events)  # §8.1.1: not as declared
                return
        if ended:
            self._remote_close(sid, stream)
        elif size > len(data):
            self._give_back(sid, stream, size - len(data))  # padding: never the application's
        events.append(Data(sid, data, ended))

    def consumed(self, sid: int, size: int) -> None:
        """The application has taken ``size`` bytes of a stream's data: the peer may send as
        much more (said once half the stream window is owed)."""
        stream = self._streams.get(sid)
        if stream is not None and not stream.remote_closed:
            self._give_back(sid, stream, size)

    def _give_back(self, sid: int, stream: StreamState, size: int) -> None:
        stream.returned += size
        if stream.returned and stream.returned >= self._initial_recv // 2:
            self._out += f.window_update(sid, stream.returned)
            stream.recv_window += stream.returned
            stream.returned = 0

    def _headers(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not sid:
            raise ConnectionError_(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        payload = f.unpadded(flags, payload)
        if flags & f.PRIORITY_FLAG:
            if len(payload) >= 4 and U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
                # §5.3.1: a stream cannot depend on itself. A connection error, not the
                # stream's: its header block (HPACK state) would still have to be read.
                raise ConnectionError_(f.PROTOCOL_ERROR, f"stream {sid} depends on itself")
            payload = payload[5:]
        if flags & f.END_HEADERS:
            self._header_block(sid, flags, payload, events)
        else:
            self._block, self._block_frames = (sid, flags, bytearray(payload)), 0

    def _header_block(self, sid: int, flags: int, block: bytes, events: list[Event]) -> None:
        try:  # decoded even for a stream refused below: HPACK state is ours
            headers, decoded = self._blocks.decode(block)
        except TooManyFields as exc:
            raise ConnectionError_(f.ENHANCE_YOUR_CALM, f"header block: {exc}") from exc
        except DecodingError as exc:
            raise ConnectionError_(f.COMPRESSION_ERROR, f"header block: {exc}") from exc
        # pure-Python HPACK costs per field and per byte decoded; a remembered block costs 0
        work = (len(block) // DECODED_BYTES_PER_FRAME + DECODED_FIELD_FRAMES * len(headers)
                if decoded else 0)
        self._work(work)
        ended = bool(flags & f.END_STREAM)
        stream = self._streams.get(sid)
        if stream is not None:  # trailers
            if stream.remote_closed:
                return self._after_close(sid, stream, events)
            if not ended:
                raise ConnectionError_(f.PROTOCOL_ERROR, "trailers without END_STREAM")
            self._remote_close(sid, stream)
            events.append(Data(sid, b"", True))
            return
        if sid <= self._last_stream and sid in self._closed:
            if self._closed[sid]:
                return  # trailers the peer sent before it saw our reset (§5.1, "closed")
            raise ConnectionError_(f.STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        if sid <= self._last_stream and sid % 2 and ended and sid <= self._closed_before:
            return  # trailers of a stream too old to place: ignored, like its DATA
        if sid % 2 == 0 or sid <= self._last_stream:
            raise ConnectionError_(f.PROTOCOL_ERROR, f"stream {sid} cannot be opened")
        self._last_stream = sid
        limit = self._max_streams if self.settings_acked else max(self._max_streams,
                                                                   UNACKED_STREAMS)
        if self._goaway_at is not None or len(self._streams) >= limit:
            self._control()
            self._out += f.rst_stream(sid, f.REFUSED_STREAM)
            self._remember(sid, True)
            return
        too_large = (len(headers) > MAX_HEADER_FIELDS
                     or sum(len(k) + len(v) + 32 for k, v in headers) > self._max_list)
        why = not too_large and malformed(headers)
        if why:  # a stream error (§8.1.1): this stream only
            self._control()
            self._out += f.rst_stream(sid, f.PROTOCOL_ERROR)
            self._remember(sid, True)
            return
        stream = StreamState(self._peer_initial, self._initial_recv)
        self._streams[sid] = stream
        self._work(NEW_STREAM_FRAMES)
        if too_large:  # but decoded whole: refused on its stream alone
            self.send_headers(sid, _TOO_LARGE, end_stream=True)
            if ended:
                self._remote_close(sid, stream)
            else:
                self.finish(sid)
            self._control(1 + work)  # the work it took served nothing
            return
        stream.length_left = content_length(headers)
        if ended:
            if stream.length_left:
                self._reset(sid, f.PROTOCOL_ERROR)
                return
            stream.remote_closed = True
        events.append(Request(sid, headers, ended))

    def _remote_close(self, sid: int, stream: StreamState) -> None:
        stream.remote_closed = True
        if stream.local_closed and not stream.pending:  # else the rest still goes out
            self._forget(sid)

    def _forget(self, sid: int, by_us: bool = False) -> bool:
        self._blocked.discard(sid)
        self._starved.discard(sid)
        if self._streams.pop(sid, None) is None:
            return False
        self._remember(sid, by_us)
        return True

    def _remember(self, sid: int, by_us: bool) -> None:
        self._closed[sid] = by_us
        if len(self._closed) > CLOSED_KEPT:
            oldest = next(iter(self._closed))
            del self._closed[oldest]
            self._closed_before = max(self._closed_before, oldest)

    def _stream_error(self, sid: int, code: int, events: list[Event]) -> None:
        """RST_STREAM with ``code``; an open stream's handler hears of it."""
        if sid in self._streams:
            self._reset(sid, code)
            events.append(Reset(sid, code))
        else:
            self._out += f.rst_stream(sid, code)

    def _after_close(self, sid: int, stream: StreamState | None, events: list[Event]) -> None:
        """DATA or HEADERS on a stream the peer had ended: a stream error (§5.1,
        "half-closed (remote)" and "closed"), unless we reset it and the frame was on its way."""
        if stream is not None or self._closed.get(sid) is False:
            self._stream_error(sid, f.STREAM_CLOSED, events)  # half-closed: our answer stops
