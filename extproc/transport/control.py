"""The control frames of a server HTTP/2 connection (SETTINGS, WINDOW_UPDATE, PING's drain,
peer resets) and what a peer may spend on them: the budgets of ``calm.py`` and the work a turn
may do. A mixin of ``ServerConnection``, which owns the state named here.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable

from . import frames as f
from .calm import Calm
from .h2events import ConnectionError_, Event, Reset
from .sending import Sending

_PAIR = struct.Struct(">HI")
U32 = struct.Struct(">I")  # a stream id or an error code
# A stream opened costs as much as this many frames (its call and its handler's task): a turn
# starts 32 at most, and a burst of thousands still flows
NEW_STREAM_FRAMES = 8
# Bytes of header block decoded anew (not remembered) that cost as much as one frame
DECODED_BYTES_PER_FRAME = 64
# Frames one field of a header block decoded anew costs as much as (pure-Python HPACK: a field
# is several function calls, a flood frame about one), on top of its bytes
DECODED_FIELD_FRAMES = 2
# SETTINGS entries taken as one frame's work (RFC 9113 defines 6 kinds); each one more draws on
# the control budget and on the turn: a frame of 2,730 entries is a flood, not a setting
SETTINGS_ENTRIES = 16
# The opaque data of the PING that follows a draining GOAWAY: its ACK says the peer has seen it.
DRAIN_PING = b"drain\x00\x00\x00"
# Seconds a draining connection waits for that ACK before it refuses new streams regardless.
DRAIN_NOTICE_WAIT = 1.0


class Control(Sending):
    """SETTINGS, WINDOW_UPDATE, the drain and the budgets, for ``ServerConnection``."""

    _calm: Calm
    _clock: Callable[[], float]
    _turn_left: int
    _draining: tuple[int, float] | None
    _peer_initial: int
    settings_acked: bool

    if TYPE_CHECKING:  # ServerConnection's, declared for the type checker only
        def _stream_error(self, sid: int, code: int, events: list[Event]) -> None: ...

    def _work(self, frames: int) -> None:
        """A frame that costs as much as ``frames`` ordinary ones: the rest of the turn waits."""
        self._turn_left -= frames

    def _control(self, count: int = 1) -> None:
        """A frame that asks work and serves nothing (``count``: as much as that many): drawn
        on its budget, cut past it."""
        if not self._calm.control_frame(count):
            raise ConnectionError_(f.ENHANCE_YOUR_CALM, "too many control frames")

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self.settings_acked = True
            return
        if len(payload) % 6:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS of a partial entry")
        initial = frame_size = None
        entries = len(payload) // 6
        if entries > SETTINGS_ENTRIES:  # a SETTINGS has 6 kinds of entry: more is a flood
            self._control(entries - SETTINGS_ENTRIES)
            self._work(entries // 8)
        for at in range(0, len(payload), 6):
            key, value = _PAIR.unpack_from(payload, at)
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(f.FLOW_CONTROL_ERROR, "initial window too large")
                initial = value
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_FRAME_SIZE <= value <= f.MAX_FRAME_SIZE_LIMIT:
                    raise ConnectionError_(f.PROTOCOL_ERROR, "max frame size out of range")
                frame_size = value
            elif key == f.HEADER_TABLE_SIZE:
                self._size_update_due = True
            elif key == f.ENABLE_PUSH and value > 1:
                raise ConnectionError_(f.PROTOCOL_ERROR, "ENABLE_PUSH other than 0 or 1")
        self._out += f.frame(f.SETTINGS, f.ACK, 0)
        # Only the last value of each counts (§6.5.3 processes them in order): one pass over
        # the streams per frame, not per entry (a frame may carry 174,762 of them).
        if frame_size is not None:
            self._peer_frame = frame_size
        if initial is not None and initial != self._peer_initial:
            delta, self._peer_initial = initial - self._peer_initial, initial
            for stream in self._streams.values():
                stream.send_window += delta
                if stream.send_window > f.MAX_WINDOW:  # §6.9.2
                    raise ConnectionError_(f.FLOW_CONTROL_ERROR, "a stream window overflows")
            if delta > 0:
                self._unstarve(list(self._starved))

    def _window_update(self, sid: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong size")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if not increment:
                raise ConnectionError_(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._conn_send += increment
            if self._conn_send > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self._streams.get(sid)
            if stream is None:
                if sid > self._last_stream:
                    raise ConnectionError_(f.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                if not increment:
                    self._stream_error(sid, f.PROTOCOL_ERROR, events)  # §6.9
                return  # (else allowed on closed streams for a while: §6.9)
            stream.send_window += increment
            if not increment or stream.send_window > f.MAX_WINDOW:
                code = f.PROTOCOL_ERROR if not increment else f.FLOW_CONTROL_ERROR
                self._reset(sid, code)
                events.append(Reset(sid, code))  # its handler must stop waiting on it
                return
            self._unstarve((sid,))
            return
        self._flush_blocked()

    def _peer_reset(self) -> None:
        """The peer reset an open stream. Past the reset budget (HTTP/2 rapid reset) the
        connection is drained, not cut: a crowd of Envoy's clients giving up at once is no
        attack, and its other streams must not be lost. Resets past the budget while the
        peer has not confirmed the drain notice count as control frames: a peer that goes on
        opening and resetting streams without reading ends up cut."""
        if self._calm.peer_reset():
            return
        if self._draining is None and self._goaway_at is None:
            self.drain(f.ENHANCE_YOUR_CALM)
        elif self._goaway_at is None:
            self._control()
            if self._clock() - self._draining[1] > DRAIN_NOTICE_WAIT:  # type: ignore[index]
                self.goaway(self._draining[0])  # type: ignore[index]

    def drain(self, code: int = f.NO_ERROR) -> None:
        """Ask the peer to open no more streams, losing none it has already sent: a GOAWAY
        naming the highest possible stream and a PING; its ACK (the peer has seen the
        notice) brings the final GOAWAY, which names the last stream served (RFC 9113 §6.8's
        graceful shutdown, as nghttp2's shutdown notice)."""
        if self._draining is None and self._goaway_at is None and not self.closed:
            self._draining = (code, self._clock())
            self._out += f.goaway(f.MAX_WINDOW, code) + f.frame(f.PING, 0, 0, DRAIN_PING)
