"""What a peer may cost (extproc/transport/calm.py, connection.py): budgets for control frames
and resets on an injected clock, a turn's worth of frames per read, header lists refused on
their stream. Counted in frames and events, never in time."""

from __future__ import annotations

import struct

import hpack
import pytest
from test_h2_connection import REQUEST, frames_of, goaway_code, headers_frame

from extproc.transport import calm
from extproc.transport import frames as f
from extproc.transport.connection import MAX_HEADER_LIST, ServerConnection
from extproc.transport.control import DECODED_FIELD_FRAMES, DRAIN_PING, NEW_STREAM_FRAMES
from extproc.transport.h2events import Closed, Data, Request, Reset


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def server_on(clock: Clock, **kw: int) -> ServerConnection:
    """A server past the preface and the client's SETTINGS, on ``clock``."""
    server = ServerConnection(clock=clock, **kw)
    server.receive(f.PREFACE + f.settings({}))
    server.data_to_send()
    return server


def goaways(data: bytes) -> list[tuple[int, int]]:
    """(last stream, code) of every GOAWAY among raw frames."""
    return [struct.unpack(">II", p[:8]) for k, _fl, _s, p in frames_of(data) if k == f.GOAWAY]


CONTROL_FLOODS = {
    "ping": f.frame(f.PING, 0, 0, b"12345678"),
    "settings": f.settings({}),
    "window-update": f.window_update(0, 1),
    "priority": f.frame(f.PRIORITY, 0, 1, struct.pack(">IB", 0, 16)),
    "unknown-type": f.frame(0xEE, 0, 0, b"x"),
}


@pytest.mark.parametrize("frame", CONTROL_FLOODS.values(), ids=CONTROL_FLOODS.keys())
def test_a_control_frame_flood_ends_past_its_budget(frame: bytes) -> None:
    server = server_on(Clock())
    burst = int(calm.CONTROL_BURST)
    assert not any(isinstance(e, Closed) for e in server.receive(frame * (burst - 1)))
    assert not server.closed
    events = server.receive(frame * 2)
    assert [e.code for e in events if isinstance(e, Closed)] == [f.ENHANCE_YOUR_CALM]
    assert goaway_code(server.data_to_send()) == f.ENHANCE_YOUR_CALM


def test_control_frames_at_the_budgets_rate_go_on_for_ever() -> None:
    clock = Clock()
    server = server_on(clock)
    per_tick = int(calm.CONTROL_PER_SECOND // 10)
    for _ in range(200):  # 20 s of PINGs at the steady rate: twice the burst over and over
        server.receive(CONTROL_FLOODS["ping"] * per_tick)
        clock.now += 0.1
    assert not server.closed


def test_empty_data_frames_draw_on_the_control_budget() -> None:
    server = server_on(Clock())
    server.receive(headers_frame(1, end=False))
    empty = f.frame(f.DATA, 0, 1, b"")
    events = server.receive(empty * int(calm.CONTROL_BURST + 1))
    assert [e.code for e in events if isinstance(e, Closed)] == [f.ENHANCE_YOUR_CALM]


def open_and_reset(server: ServerConnection, first: int, count: int) -> list:
    """``count`` streams opened and reset by the peer at once (HTTP/2 rapid reset)."""
    data = b"".join(headers_frame(sid, end=False) + f.rst_stream(sid, f.CANCEL)
                    for sid in range(first, first + 2 * count, 2))
    return server.receive(data)


def test_rapid_reset_drains_the_connection_and_loses_no_open_stream() -> None:
    clock = Clock()
    server = server_on(clock)
    server.receive(headers_frame(1, end=False))  # a stream that stays open throughout
    burst = int(calm.RESET_BURST)
    events = open_and_reset(server, 3, burst)
    assert sum(isinstance(e, Reset) for e in events) == burst
    assert goaways(server.data_to_send()) == []  # within the budget: nothing said
    open_and_reset(server, 3 + 2 * burst, 1)
    said = server.data_to_send()
    # the notice: no stream refused yet (one may be on its way), and a PING to learn it arrived
    assert goaways(said) == [(f.MAX_WINDOW, f.ENHANCE_YOUR_CALM)]
    assert (f.PING, 0, 0, DRAIN_PING) in frames_of(said)
    assert server.draining and not server.drained
    server.receive(f.frame(f.PING, f.ACK, 0, DRAIN_PING))
    last = 3 + 2 * burst
    assert goaways(server.data_to_send()) == [(last, f.ENHANCE_YOUR_CALM)]
    late = server.receive(headers_frame(last + 2, end=False))
    assert late == [] and (f.RST_STREAM, 0, last + 2, struct.pack(">I", f.REFUSED_STREAM)) \
        in frames_of(server.data_to_send())
    # the stream opened before it all still runs to its end, then the connection may close
    assert server.receive(f.frame(f.DATA, f.END_STREAM, 1, b"x")) == [Data(1, b"x", True)]
    server.send_headers(1, f.STATUS_200, end_stream=True)
    assert server.drained and not server.closed


def test_a_peer_resetting_on_without_reading_the_notice_is_cut() -> None:
    clock = Clock()
    server = server_on(clock)
    events = open_and_reset(server, 1, int(calm.RESET_BURST + calm.CONTROL_BURST) + 10)
    assert [e.code for e in events if isinstance(e, Closed)] == [f.ENHANCE_YOUR_CALM]


def test_resets_at_the_budgets_rate_never_drain() -> None:
    clock = Clock()
    server = server_on(clock)
    per_tick, sid = int(calm.RESET_PER_SECOND // 10), 1
    for _ in range(100):
        open_and_reset(server, sid, per_tick)
        sid += 2 * per_tick
        clock.now += 0.1
    assert goaways(server.data_to_send()) == [] and not server.draining


def test_frames_are_read_a_turn_at_a_time_and_none_is_lost() -> None:
    server = server_on(Clock())
    message = b"".join(f.frame(f.DATA, 0, 1, bytes((i % 251,))) for i in range(1000))
    server.receive(headers_frame(1, end=False))
    events = server.receive(message + f.frame(f.DATA, f.END_STREAM, 1, b"!"), max_frames=256)
    turns = 1
    while server.backlog:
        assert len(events) <= 256 * turns
        events += server.receive(b"", max_frames=256)
        turns += 1
    assert turns == 4  # 1,001 frames, 256 a turn
    assert b"".join(e.data for e in events) == bytes(i % 251 for i in range(1000)) + b"!"
    assert events[-1].ended


def test_a_header_list_over_the_limit_is_refused_on_its_stream_alone() -> None:
    server = server_on(Clock())
    big = REQUEST + [(b"x-filler", b"f" * (MAX_HEADER_LIST + 100))]
    block = hpack.Encoder().encode(big)  # a literal of the encoder's choice: decodes whole
    data = (f.frame(f.HEADERS, f.END_STREAM, 1, block[:8000])
            + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[8000:]))
    assert server.receive(data) == []  # nothing for the application
    refused_with_431_alone(server)


def refused_with_431_alone(server: ServerConnection) -> None:
    """Stream 1 was answered 431 and nothing else, and the connection takes stream 3."""
    answer = frames_of(server.data_to_send())
    assert [(k, sid) for k, _fl, sid, _p in answer] == [(f.HEADERS, 1)]
    assert hpack.Decoder().decode(answer[0][3]) == [(":status", "431")]
    events = server.receive(headers_frame(3))
    assert [type(e) for e in events] == [Request] and not server.closed


def test_a_settings_frame_of_thousands_of_entries_is_a_flood() -> None:
    server = server_on(Clock())
    flood = f.frame(f.SETTINGS, 0, 0, struct.pack(">HI", f.INITIAL_WINDOW_SIZE, 65535)
                    * (f.DEFAULT_FRAME_SIZE // 6))
    events = server.receive(flood * 2)  # 2 x 2,714 entries past the 16 a SETTINGS may need
    assert [e.code for e in events if isinstance(e, Closed)] == [f.ENHANCE_YOUR_CALM]


def test_header_blocks_decoded_anew_weigh_on_the_turn() -> None:
    server = server_on(Clock())
    blocks = [hpack.Encoder().encode(REQUEST + [(b"x-fill", b"%d" % sid + b"v" * 8000)])
              for sid in range(1, 20, 2)]
    data = b"".join(f.frame(f.HEADERS, f.END_HEADERS, sid, block)
                    for sid, block in zip(range(1, 20, 2), blocks))
    first = server.receive(data, max_frames=256)
    assert 0 < len(first) < 10 and server.backlog  # a few ~8 KB decodes fill a turn
    events = first
    while server.backlog:
        events += server.receive(b"", max_frames=256)
    assert [e.stream_id for e in events] == list(range(1, 20, 2))  # none lost
    assert server.receive(b"", max_frames=256) == []  # a turn waited out: the last decode's
    # an ordinary request (~100 bytes of block, its literals indexed: decoded anew each time)
    # costs its start and its fields: a turn opens ~12 streams
    again = hpack.Encoder().encode(REQUEST)
    many = b"".join(f.frame(f.HEADERS, f.END_HEADERS, sid, again) for sid in range(21, 221, 2))
    opened = server.receive(many, max_frames=256)
    each = 1 + NEW_STREAM_FRAMES + DECODED_FIELD_FRAMES * len(REQUEST)
    assert 256 // (each + 4) <= len(opened) <= 256 // each + 1
    while server.backlog:
        opened += server.receive(b"", max_frames=256)
    assert len(opened) == 100
