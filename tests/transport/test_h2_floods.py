"""Control frames cost work independent of the number of streams, and floods of empty
CONTINUATION frames end (extproc/transport/connection.py), counted in work done, not time."""

from __future__ import annotations

import struct

from test_h2_connection import frames_of, goaway_code, headers_frame, raw_server

from extproc.transport import frames as f
from extproc.transport.connection import MAX_CONTINUATIONS, ServerConnection


class Counting(ServerConnection):
    """A server connection that counts its attempts to send a stream's DATA."""

    visits = 0

    def _emit_data(self, sid, stream, data, end):  # type: ignore[no-untyped-def]
        Counting.visits += 1
        return super()._emit_data(sid, stream, data, end)


def starved_server(streams: int) -> Counting:
    """A server with ``streams`` open streams, each with output its own (0) window holds."""
    server = Counting(max_concurrent_streams=streams + 10)
    server.receive(f.PREFACE + f.settings({f.INITIAL_WINDOW_SIZE: 0}))
    for i in range(streams):
        sid = 1 + 2 * i
        server.receive(headers_frame(sid, end=False))
        server.send_headers(sid, f.STATUS_200)
        server.send_data(sid, b"x" * 10)
        assert server.blocked(sid)
    server.data_to_send()
    return server


def test_connection_window_updates_do_not_walk_starved_streams() -> None:
    server = starved_server(2000)
    Counting.visits = 0
    for _ in range(500):
        server.receive(f.window_update(0, 1))
    assert Counting.visits == 0  # nothing the connection's window could move


def test_empty_settings_do_not_walk_waiting_streams() -> None:
    server = starved_server(2000)
    Counting.visits = 0
    for _ in range(500):
        server.receive(f.settings({}))
    assert Counting.visits == 0
    assert len(frames_of(server.data_to_send())) == 500  # each acknowledged


def test_a_stream_window_update_visits_that_stream_only() -> None:
    server = starved_server(2000)
    Counting.visits = 0
    server.receive(f.window_update(7, 100))
    assert Counting.visits == 1
    sent = frames_of(server.data_to_send())
    assert [(kind, sid) for kind, _, sid, _ in sent] == [(f.DATA, 7)]


def test_a_settings_frame_of_many_window_entries_is_one_pass() -> None:
    server = starved_server(200)
    # as many entries as a 16 KiB frame holds (the old 1 MiB frames held 174,762)
    payload = b"".join(struct.pack(">HI", f.INITIAL_WINDOW_SIZE, 0)
                       for _ in range(f.DEFAULT_FRAME_SIZE // 6))
    server.receive(f.frame(f.SETTINGS, 0, 0, payload[:-6] + struct.pack(
        ">HI", f.INITIAL_WINDOW_SIZE, 100)))
    sent = frames_of(server.data_to_send())
    assert sum(1 for kind, *_ in sent if kind == f.DATA) == 200  # the last value counted
    assert not any(server.blocked(1 + 2 * i) for i in range(200))


def test_empty_continuation_frames_end_the_connection() -> None:
    server = raw_server()
    head = headers_frame(1, end=True)
    server.receive(f.frame(f.HEADERS, f.END_STREAM, 1, head[9:]))  # no END_HEADERS
    for _ in range(MAX_CONTINUATIONS):
        assert server.receive(f.frame(f.CONTINUATION, 0, 1, b"")) == []
    events = server.receive(f.frame(f.CONTINUATION, 0, 1, b""))
    assert events and server.closed
    assert goaway_code(server.data_to_send()) == f.ENHANCE_YOUR_CALM
