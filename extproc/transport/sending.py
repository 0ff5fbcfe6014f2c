"""The sending half of a server HTTP/2 connection: header blocks and DATA out, as the peer's
windows allow (RFC 9113 §5.2, §6.9), and the streams' local ends.

Output a window holds back waits in its stream's ``pending`` queue. A stream whose own window
has room waits in ``_blocked`` (for the connection's window), one whose own window is spent
in ``_starved``: a frame that can free output visits only the streams it can free, so the work
per SETTINGS or WINDOW_UPDATE does not grow with the streams that wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import frames as f


class StreamState:
    """One open stream's windows, its output waiting for them, and which sides have ended."""

    __slots__ = ("send_window", "recv_window", "returned", "pending", "remote_closed",
                 "local_closed", "finishing", "length_left")

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.returned = 0  # consumed, not yet given back to the peer in a WINDOW_UPDATE
        self.pending: deque[tuple[bytes, bool, bool]] = deque()  # (payload, is_headers, end)
        self.remote_closed = False
        self.local_closed = False
        self.finishing = False  # finish() came while output was pending: reset once it went
        self.length_left: int | None = None  # of a declared content-length (§8.1.1)


class Sending:
    """The send side of ``ServerConnection``, which owns the state named here and the
    closed-stream record (``_forget``)."""

    _out: bytearray
    _streams: dict[int, StreamState]
    _blocked: set[int]
    _starved: set[int]
    _conn_send: int
    _peer_frame: int
    _size_update_due: bool
    _last_stream: int
    _goaway_at: int | None
    closed: bool

    if TYPE_CHECKING:  # ServerConnection's, declared for the type checker only
        def _forget(self, sid: int, by_us: bool = False) -> bool: ...

    def send_headers(self, sid: int, fields: bytes, end_stream: bool = False) -> None:
        """Send a header block (``fields``: encoded by ``frames``, without the table)."""
        stream = self._streams.get(sid)
        if stream is None or stream.local_closed:
            return  # reset meanwhile: nothing more to say on it
        if stream.pending:
            stream.pending.append((fields, True, end_stream))
            if end_stream:
                stream.local_closed = True
            return
        self._emit_headers(sid, fields, end_stream)
        if end_stream:
            self._local_close(sid, stream)

    def _emit_headers(self, sid: int, fields: bytes, end_stream: bool) -> None:
        if self._size_update_due:
            fields, self._size_update_due = f.TABLE_SIZE_ZERO + fields, False
        limit = self._peer_frame
        flags = f.END_STREAM if end_stream else 0
        if len(fields) <= limit:
            self._out += f.frame(f.HEADERS, flags | f.END_HEADERS, sid, fields)
            return
        self._out += f.frame(f.HEADERS, flags, sid, fields[:limit])
        for at in range(limit, len(fields), limit):
            last = at + limit >= len(fields)
            self._out += f.frame(f.CONTINUATION, f.END_HEADERS if last else 0, sid,
                                 fields[at:at + limit])

    def send_data(self, sid: int, data: bytes, end_stream: bool = False) -> None:
        """Send ``data`` on a stream as its send windows allow; the rest waits for them."""
        stream = self._streams.get(sid)
        if stream is None or stream.local_closed:
            return
        if end_stream:
            stream.local_closed = True
        if stream.pending:
            stream.pending.append((data, False, end_stream))
            return
        rest = self._emit_data(sid, stream, data, end_stream)
        if rest is not None:
            stream.pending.append((rest, False, end_stream))
            (self._starved if stream.send_window <= 0 else self._blocked).add(sid)
        elif end_stream:
            self._local_close(sid, stream)

    def blocked(self, sid: int) -> bool:
        """Whether output on the stream waits for the peer's windows."""
        return sid in self._blocked or sid in self._starved

    def _emit_data(self, sid: int, stream: StreamState, data: bytes, end: bool) -> bytes | None:
        """Send what the windows allow; the unsent rest, or None when all went."""
        at, size = 0, len(data)
        while True:
            n = min(size - at, stream.send_window, self._conn_send, self._peer_frame)
            if n <= 0 and size - at > 0:
                return data[at:]
            last = at + n >= size
            self._out += f.frame(f.DATA, f.END_STREAM if end and last else 0, sid,
                                 data[at:at + n])
            stream.send_window -= n
            self._conn_send -= n
            at += n
            if last:
                return None

    def _flush_blocked(self) -> None:
        """Send what waits for the connection's window, while it has room."""
        for sid in list(self._blocked):
            if self._conn_send <= 0:
                return
            self._flush_stream(sid)

    def _unstarve(self, sids: Iterable[int]) -> None:
        """Streams whose own window grew: wait for the connection's (and try it at once)."""
        for sid in sids:
            stream = self._streams.get(sid)
            if stream is not None and stream.send_window > 0 and sid in self._starved:
                self._starved.discard(sid)
                self._blocked.add(sid)
                if self._conn_send > 0:
                    self._flush_stream(sid)

    def _flush_stream(self, sid: int) -> None:
        """Send one waiting stream's pending output as far as the windows allow."""
        stream = self._streams.get(sid)
        if stream is None:
            self._blocked.discard(sid)
            return
        while stream.pending:
            payload, is_headers, end = stream.pending[0]
            if is_headers:
                self._emit_headers(sid, payload, end)
                stream.pending.popleft()
                continue
            rest = self._emit_data(sid, stream, payload, end)
            if rest is not None:
                stream.pending[0] = (rest, False, end)
                if stream.send_window <= 0:
                    self._blocked.discard(sid)
                    self._starved.add(sid)
                return
            stream.pending.popleft()
        self._blocked.discard(sid)
        if stream.finishing and not stream.remote_closed:
            self._reset(sid, f.NO_ERROR)
        elif stream.local_closed:
            self._local_close(sid, stream)

    def _local_close(self, sid: int, stream: StreamState) -> None:
        stream.local_closed = True
        if stream.remote_closed:
            self._forget(sid)

    def reset(self, sid: int, code: int = f.CANCEL) -> None:
        """Reset a stream (RST_STREAM); its pending output is dropped."""
        if sid in self._streams:
            self._reset(sid, code)

    def _reset(self, sid: int, code: int) -> None:
        self._forget(sid, by_us=True)
        self._out += f.rst_stream(sid, code)

    def finish(self, sid: int) -> None:
        """Our side is done: a peer still sending is asked to stop (RST_STREAM NO_ERROR,
        §8.1), once what is pending has gone."""
        stream = self._streams.get(sid)
        if stream is not None and not stream.remote_closed:
            if stream.pending:
                stream.finishing = True  # else the stream stays while the peer keeps it open
            else:
                self._reset(sid, f.NO_ERROR)

    def goaway(self, code: int = f.NO_ERROR) -> None:
        """Say no new stream will be served (graceful: the open ones continue)."""
        if self._goaway_at is None and not self.closed:
            self._goaway_at = self._last_stream
            self._out += f.goaway(self._last_stream, code)
