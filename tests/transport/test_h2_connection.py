"""The sans-IO HTTP/2 server connection (extproc/transport/connection.py), driven by the
independent ``h2`` library as the client, and by hand-made frames where h2 would refuse to
send what the test needs (protocol errors, floods)."""

from __future__ import annotations

import struct

import h2.config
import h2.errors
import h2.connection
import h2.events as ev
import h2.settings
import hpack
import pytest

from extproc.transport import frames as f
from extproc.transport.connection import ServerConnection
from extproc.transport.h2events import Closed, Data, Request, Reset

S = h2.settings.SettingCodes
REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/pkg.Svc/Call"),
           (b":authority", b"test"), (b"content-type", b"application/grpc"),
           (b"te", b"trailers")]
HEAD = f.STATUS_200 + f.literal(b"content-type", b"application/grpc")
TRAILERS = f.literal(b"grpc-status", b"0")


class Pair:
    """A ServerConnection and an h2 client connection joined by in-memory byte pipes."""

    def __init__(self, client_settings: dict[int, int] | None = None, **server: int) -> None:
        self.server = ServerConnection(**server)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(config)
        self.client.local_settings = h2.settings.Settings(
            client=True, initial_values=client_settings or {})
        self.client.initiate_connection()
        self.server_events: list = []
        self.client_events: list = []
        self.pump()

    def pump(self, rounds: int = 50) -> None:
        """Move bytes both ways until neither side has anything to say (bounded)."""
        for _ in range(rounds):
            to_server = self.client.data_to_send()
            if to_server:
                self.server_events += self.server.receive(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.client_events += self.client.receive_data(to_client)
            if not to_server and not to_client:
                return
        raise AssertionError("the connection kept talking")

    def raw(self, data: bytes) -> list:
        """Hand-made bytes to the server; its events (also kept in server_events)."""
        events = self.server.receive(data)
        self.server_events += events
        return events

    def open(self, end: bool = False) -> int:
        """A new request stream from the client."""
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, REQUEST, end_stream=end)
        self.pump()
        return sid

    def take(self, kind: type) -> list:
        """The client events of ``kind`` so far (and forget them)."""
        found = [e for e in self.client_events if isinstance(e, kind)]
        self.client_events = [e for e in self.client_events if not isinstance(e, kind)]
        return found

    def received(self, sid: int) -> bytes:
        """The DATA the client got on ``sid`` so far, acknowledged (window returned)."""
        out = b""
        for event in self.take(ev.DataReceived):
            if event.stream_id == sid:
                out += event.data
                self.client.acknowledge_received_data(event.flow_controlled_length, sid)
        return out


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """Split raw server output into (type, flags, stream, payload)."""
    out, at = [], 0
    while at < len(data):
        first, flags, sid = f.HEADER.unpack_from(data, at)
        length = first >> 8
        out.append((first & 0xFF, flags, sid & 0x7FFFFFFF,
                    data[at + 9:at + 9 + length]))
        at += 9 + length
    assert at == len(data)
    return out


def raw_server(**kw: int) -> ServerConnection:
    """A server past the preface, the client's (empty) SETTINGS and its acknowledgement of the
    server's, its output drained."""
    server = ServerConnection(**kw)
    assert server.receive(f.PREFACE + f.settings({}) + f.frame(f.SETTINGS, f.ACK, 0)) == []
    server.data_to_send()
    return server


def headers_frame(sid: int, end: bool = True, fields: list | None = None) -> bytes:
    """A HEADERS frame opening ``sid`` with a fresh encoder (no dynamic table state)."""
    block = hpack.Encoder().encode(fields or REQUEST)
    return f.frame(f.HEADERS, f.END_HEADERS | (f.END_STREAM if end else 0), sid, block)


def goaway_code(data: bytes) -> int | None:
    """The error code of the GOAWAY among raw frames, if any."""
    for kind, _flags, _sid, payload in frames_of(data):
        if kind == f.GOAWAY:
            return struct.unpack(">II", payload[:8])[1]
    return None


# ---- preface and settings --------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\n\r\n", b"PRI * HTTP/1.1\r\n",
                                     b"\x16\x03\x01\x00", b"x"])
def test_a_wrong_preface_is_a_protocol_error(garbage: bytes) -> None:
    server = ServerConnection()
    server.data_to_send()
    events = server.receive(garbage)
    assert events == [Closed(f.PROTOCOL_ERROR, "not an HTTP/2 preface")]
    assert server.closed
    assert goaway_code(server.data_to_send()) == f.PROTOCOL_ERROR
    assert server.receive(f.PREFACE) == []  # nothing more once closed


def test_a_wrong_preface_of_full_length_is_a_protocol_error() -> None:
    server = ServerConnection()
    events = server.receive(f.PREFACE[:-1] + b"X" + f.settings({}))
    assert [type(e) for e in events] == [Closed] and events[0].code == f.PROTOCOL_ERROR


def test_the_preface_may_come_a_byte_at_a_time() -> None:
    server = ServerConnection()
    first = frames_of(server.data_to_send())
    assert first[0][0] == f.SETTINGS  # the server speaks first, without waiting
    for byte in f.PREFACE + f.settings({}) + headers_frame(1):
        events = server.receive(bytes((byte,)))
    assert [type(e) for e in events] == [Request]
    assert not server.closed


def test_the_server_settings_and_window_reach_the_client() -> None:
    pair = Pair(max_concurrent_streams=7, initial_window=1 << 18, connection_window=1 << 22,
                max_header_list_size=1 << 14)
    changed = pair.take(ev.RemoteSettingsChanged)[0].changed_settings
    assert changed[S.MAX_CONCURRENT_STREAMS].new_value == 7
    assert changed[S.INITIAL_WINDOW_SIZE].new_value == 1 << 18
    assert S.MAX_FRAME_SIZE not in changed  # RFC 9113's default, 16 KiB: not said
    assert changed[S.MAX_HEADER_LIST_SIZE].new_value == 1 << 14
    assert changed[S.ENABLE_PUSH].new_value == 0
    assert pair.client.outbound_flow_control_window == 1 << 22
    assert pair.take(ev.SettingsAcknowledged)  # the client's SETTINGS acknowledged


def test_settings_are_acknowledged_each_time() -> None:
    pair = Pair()
    pair.take(ev.SettingsAcknowledged)
    for value in (100, 200):
        pair.client.update_settings({S.INITIAL_WINDOW_SIZE: value})
        pair.pump()
        assert len(pair.take(ev.SettingsAcknowledged)) == 1


@pytest.mark.parametrize("payload,code", [
    (struct.pack(">HI", f.INITIAL_WINDOW_SIZE, 2**31), f.FLOW_CONTROL_ERROR),
    (struct.pack(">HI", f.MAX_FRAME_SIZE, 16_383), f.PROTOCOL_ERROR),
    (struct.pack(">HI", f.MAX_FRAME_SIZE, 2**24), f.PROTOCOL_ERROR),
    (b"\x00\x04\x00", f.FRAME_SIZE_ERROR),
])
def test_bad_settings_are_connection_errors(payload: bytes, code: int) -> None:
    server = raw_server()
    events = server.receive(f.frame(f.SETTINGS, 0, 0, payload))
    assert [type(e) for e in events] == [Closed] and events[0].code == code
    assert goaway_code(server.data_to_send()) == code


def test_settings_on_a_stream_and_an_ack_with_payload_are_errors() -> None:
    server = raw_server()
    assert server.receive(f.frame(f.SETTINGS, 0, 1))[0].code == f.PROTOCOL_ERROR
    server = raw_server()
    assert server.receive(f.frame(f.SETTINGS, f.ACK, 0, b"\0" * 6))[0].code == \
        f.FRAME_SIZE_ERROR


# ---- requests, data, ping, reset --------------------------------------------------------------


def test_a_request_its_data_and_its_end() -> None:
    pair = Pair()
    sid = pair.open()
    request = pair.server_events.pop()
    assert request == Request(sid, REQUEST, False)
    pair.client.send_data(sid, b"hello")
    pair.client.send_data(sid, b" world", end_stream=True)
    pair.pump()
    assert pair.server_events == [Data(sid, b"hello", False), Data(sid, b" world", True)]
    assert pair.server.open_streams == 1  # half-closed: the response is still to come
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, b"reply")
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    pair.pump()
    assert pair.take(ev.ResponseReceived)[0].headers == [(b":status", b"200"),
                                                          (b"content-type", b"application/grpc")]
    assert pair.received(sid) == b"reply"
    assert pair.take(ev.TrailersReceived)[0].headers == [(b"grpc-status", b"0")]
    assert pair.take(ev.StreamEnded)
    assert pair.server.open_streams == 0


def test_a_request_ended_with_its_headers_and_trailers_from_the_client() -> None:
    pair = Pair()
    sid = pair.open(end=True)
    assert pair.server_events == [Request(sid, REQUEST, True)]
    sid = pair.open()
    pair.client.send_data(sid, b"x")
    pair.client.send_headers(sid, [(b"x-trailer", b"1")], end_stream=True)
    pair.pump()
    assert pair.server_events[-2:] == [Data(sid, b"x", False), Data(sid, b"", True)]


def test_ping_is_acknowledged_with_its_payload() -> None:
    pair = Pair()
    pair.client.ping(b"12345678")
    pair.pump()
    assert pair.take(ev.PingAckReceived)[0].ping_data == b"12345678"
    server = raw_server()
    assert server.receive(f.frame(f.PING, f.ACK, 0, b"\0" * 8)) == []
    assert server.data_to_send() == b""  # an ACK is not answered
    for bad in (f.frame(f.PING, 0, 0, b"\0" * 7), f.frame(f.PING, 0, 1, b"\0" * 8)):
        server = raw_server()
        assert server.receive(bad)[0].code == f.PROTOCOL_ERROR


def test_rst_stream_from_the_peer_forgets_the_stream() -> None:
    pair = Pair()
    sid = pair.open()
    pair.server.send_headers(sid, HEAD)
    pair.pump()
    pair.client.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    pair.pump()
    assert pair.server_events[-1] == Reset(sid, f.CANCEL)
    assert pair.server.open_streams == 0
    pair.server.send_data(sid, b"late")  # the handler did not know yet: nothing is sent
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    assert pair.server.data_to_send() == b""


def test_the_server_resets_and_finishes_streams() -> None:
    pair = Pair()
    sid = pair.open()
    pair.server.reset(sid, f.INTERNAL_ERROR)
    pair.pump()
    assert pair.take(ev.StreamReset)[0].error_code == f.INTERNAL_ERROR
    assert pair.server.open_streams == 0
    sid = pair.open()  # the client still sending: finish() asks it to stop (NO_ERROR)
    pair.server.send_headers(sid, HEAD + TRAILERS, end_stream=True)
    pair.server.finish(sid)
    pair.pump()
    assert pair.take(ev.StreamReset)[0].error_code == f.NO_ERROR
    assert pair.server.open_streams == 0
    # what the client had sent before it saw the reset is ignored
    assert pair.server.receive(f.frame(f.DATA, 0, sid, b"in flight")) == []
    assert not pair.server.closed


# ---- flow control, sending ---------------------------------------------------------------------


def test_sends_respect_the_stream_window_and_resume_on_window_update() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 100})
    sid = pair.open(end=True)
    body = bytes(range(256)) * 20
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, body[:3000])
    pair.server.send_data(sid, body[3000:])
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    pair.pump()
    got = b""
    for _ in range(100):
        events = [e for e in pair.client_events if isinstance(e, ev.DataReceived)]
        assert sum(len(e.data) for e in events) <= 100  # never past the window
        got += pair.received(sid)
        if len(got) < len(body):
            assert not pair.take(ev.TrailersReceived)  # trailers only after all the data
        else:
            break
        pair.pump()
    assert got == body
    pair.pump()
    assert pair.take(ev.TrailersReceived)[0].headers == [(b"grpc-status", b"0")]
    assert pair.server.open_streams == 0


def test_sends_respect_the_connection_window() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 2**31 - 1})
    sids = [pair.open(end=True) for _ in range(3)]
    body = {sid: bytes([sid]) * 50_000 for sid in sids}
    for sid in sids:
        pair.server.send_headers(sid, HEAD)
        pair.server.send_data(sid, body[sid])
        pair.server.send_headers(sid, TRAILERS, end_stream=True)
    pair.pump()
    first = [e for e in pair.client_events if isinstance(e, ev.DataReceived)]
    assert sum(len(e.data) for e in first) == f.DEFAULT_WINDOW  # the connection's, no more
    got = {sid: b"" for sid in sids}
    for _ in range(100):
        for event in pair.take(ev.DataReceived):
            got[event.stream_id] += event.data
            pair.client.acknowledge_received_data(event.flow_controlled_length,
                                                  event.stream_id)
        pair.pump()
        if got == body:
            break
    assert got == body
    assert len(pair.take(ev.TrailersReceived)) == 3
    assert pair.server.open_streams == 0


def test_initial_window_size_changes_apply_to_open_streams() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 10})
    sid = pair.open(end=True)
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, b"a" * 1000)
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    pair.pump()
    assert sum(len(e.data) for e in pair.take(ev.DataReceived)) == 10
    pair.client.update_settings({S.INITIAL_WINDOW_SIZE: 5})  # the window now -5: nothing
    pair.pump()
    assert not pair.take(ev.DataReceived)
    pair.client.update_settings({S.INITIAL_WINDOW_SIZE: 500})  # +495: 490 may go
    pair.pump()
    assert sum(len(e.data) for e in pair.take(ev.DataReceived)) == 490
    pair.client.update_settings({S.INITIAL_WINDOW_SIZE: 5000})
    pair.pump()
    assert sum(len(e.data) for e in pair.take(ev.DataReceived)) == 500
    assert pair.take(ev.TrailersReceived)
    assert pair.server.open_streams == 0


def test_data_and_header_frames_respect_the_peer_max_frame_size() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 2**31 - 1})
    pair.client.increment_flow_control_window(2**31 - 1 - f.DEFAULT_WINDOW)
    pair.pump()
    sid = pair.open(end=True)
    big = [(b"x-big-%d" % i, b"v" * 1000) for i in range(50)]
    fields = HEAD + b"".join(f.literal(n, v) for n, v in big)
    pair.server.send_headers(sid, fields)
    pair.server.send_data(sid, b"d" * 100_000)
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    out = pair.server.data_to_send()
    kinds = [(k, fl, len(p)) for k, fl, s, p in frames_of(out) if s == sid]
    assert kinds[0][0] == f.HEADERS and not kinds[0][1] & f.END_HEADERS
    assert all(length <= f.DEFAULT_FRAME_SIZE for _k, _fl, length in kinds)
    assert [k for k, _fl, _n in kinds[1:3]] == [f.CONTINUATION, f.CONTINUATION]
    assert kinds[3][1] & f.END_HEADERS and kinds[4][0] == f.DATA
    events = pair.client.receive_data(out)
    headers = next(e for e in events if isinstance(e, ev.ResponseReceived)).headers
    assert headers[2:] == big
    assert b"".join(e.data for e in events if isinstance(e, ev.DataReceived)) == b"d" * 100_000
    # a larger limit from the peer is used
    pair.client.update_settings({S.MAX_FRAME_SIZE: 40_000})
    pair.pump()
    sid = pair.open(end=True)
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, b"e" * 100_000, end_stream=True)
    sizes = [len(p) for k, _fl, s, p in frames_of(pair.server.data_to_send())
             if k == f.DATA and s == sid]
    assert sizes == [40_000, 40_000, 20_000]


def test_the_receive_windows_are_replenished_for_a_large_request() -> None:
    pair = Pair()
    sid = pair.open()
    total, chunk = 40 << 20, b"z" * 16_384
    sent = got = 0
    for _ in range(100_000):
        room = min(pair.client.local_flow_control_window(sid), total - sent)
        while room >= len(chunk) or (room and sent + room == total):
            n = min(room, len(chunk))
            pair.client.send_data(sid, chunk[:n], end_stream=sent + n == total)
            sent += n
            room = min(pair.client.local_flow_control_window(sid), total - sent)
        events = pair.server.receive(pair.client.data_to_send())
        assert not any(isinstance(e, (Reset, Closed)) for e in events)
        for event in events:
            if isinstance(event, Data):
                got += len(event.data)
                pair.server.consumed(sid, len(event.data))  # the handler took it
        pair.client.receive_data(pair.server.data_to_send())
        if got == total:
            break
    assert got == total and events[-1].ended


def test_a_stream_window_is_given_back_only_for_consumed_data() -> None:
    server = raw_server(initial_window=1000, connection_window=f.DEFAULT_WINDOW)
    server.receive(headers_frame(1, end=False) + headers_frame(3, end=False))
    events = server.receive(f.frame(f.DATA, 0, 1, b"x" * 1000))
    assert events == [Data(1, b"x" * 1000, False)]
    assert server.data_to_send() == b""  # not taken: the peer must wait
    assert server.receive(f.frame(f.DATA, 0, 1, b"x")) == [Reset(1, f.FLOW_CONTROL_ERROR)]
    server.data_to_send()
    # padding is returned at once; taken data once half the window is owed
    server.receive(f.frame(f.DATA, f.PADDED, 3, bytes((199,)) + b"y" * 300 + b"\0" * 199))
    server.consumed(3, 299)
    assert server.data_to_send() == b""
    server.consumed(3, 1)
    assert frames_of(server.data_to_send()) == [(f.WINDOW_UPDATE, 0, 3,
                                                 struct.pack(">I", 500))]
    server.receive(f.frame(f.DATA, 0, 3, b"z" * 1000))  # the window is whole again
    assert not server.closed and server.open_streams == 1
    server.consumed(1, 10)  # a stream gone: nothing
    assert server.data_to_send() == b""


def test_data_past_the_windows_is_a_flow_control_error() -> None:
    server = raw_server(initial_window=100, connection_window=f.DEFAULT_WINDOW)
    server.receive(headers_frame(1, end=False))
    events = server.receive(f.frame(f.DATA, 0, 1, b"x" * 101))
    assert events == [Reset(1, f.FLOW_CONTROL_ERROR)]
    assert server.open_streams == 0
    server = raw_server(initial_window=1 << 20, connection_window=f.DEFAULT_WINDOW)
    server.receive(headers_frame(1, end=False))
    server.receive(f.frame(f.DATA, 0, 1, b"x" * 30_000))
    events = server.receive(f.frame(f.DATA, 0, 1, b"x" * 30_000))
    assert not any(isinstance(e, Closed) for e in events)  # replenished at half
    events = server.receive(f.frame(f.DATA, 0, 1, b"x" * 30_000) * 3)
    assert not any(isinstance(e, Closed) for e in events)


def test_padding_is_stripped_and_counted() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, REQUEST, priority_weight=16, priority_depends_on=0)
    pair.pump()
    assert pair.server_events[-1] == Request(sid, REQUEST, False)
    pair.client.send_data(sid, b"padded", pad_length=200)
    pair.client.send_data(sid, b"", end_stream=True, pad_length=10)
    pair.pump()
    assert pair.server_events[-2:] == [Data(sid, b"padded", False), Data(sid, b"", True)]
    # padded HEADERS (by hand: h2 pads only DATA)
    server = raw_server()
    block = hpack.Encoder().encode(REQUEST)
    payload = bytes((7,)) + block + b"\0" * 7
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS | f.PADDED | f.END_STREAM, 1,
                                    payload))
    assert events == [Request(1, REQUEST, True)]
    # padded and with priority
    payload = bytes((3,)) + b"\0\0\0\0\x10" + hpack.Encoder().encode(REQUEST) + b"\0" * 3
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS | f.PADDED | f.PRIORITY_FLAG, 3,
                                    payload))
    assert events == [Request(3, REQUEST, False)]
    # padding as long as the frame
    events = server.receive(f.frame(f.DATA, f.PADDED, 3, b"\x05abcd"))
    assert [type(e) for e in events] == [Closed] and events[0].code == f.PROTOCOL_ERROR


def test_continuation_frames_carry_the_header_block() -> None:
    server = raw_server()
    block = hpack.Encoder().encode(REQUEST)
    parts = [block[:5], block[5:9], block[9:]]
    assert server.receive(f.frame(f.HEADERS, f.END_STREAM, 1, parts[0])) == []
    assert server.receive(f.frame(f.CONTINUATION, 0, 1, parts[1])) == []
    events = server.receive(f.frame(f.CONTINUATION, f.END_HEADERS, 1, parts[2]))
    assert events == [Request(1, REQUEST, True)]


@pytest.mark.parametrize("interruption", [
    f.frame(f.PING, 0, 0, b"\0" * 8),
    f.frame(f.CONTINUATION, f.END_HEADERS, 3, b""),
    f.frame(f.DATA, 0, 1, b"x"),
])
def test_a_header_block_may_not_be_interrupted(interruption: bytes) -> None:
    server = raw_server()
    block = hpack.Encoder().encode(REQUEST)
    server.receive(f.frame(f.HEADERS, 0, 1, block[:5]))
    events = server.receive(interruption)
    assert events == [Closed(f.PROTOCOL_ERROR, "header block interrupted")]


def test_continuation_without_headers_is_a_protocol_error() -> None:
    server = raw_server()
    events = server.receive(f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""))
    assert events[0].code == f.PROTOCOL_ERROR


def test_hpack_garbage_is_a_compression_error() -> None:
    server = raw_server()
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"))
    assert [type(e) for e in events] == [Closed] and events[0].code == f.COMPRESSION_ERROR
    assert goaway_code(server.data_to_send()) == f.COMPRESSION_ERROR
    assert server.closed


def test_a_frame_above_the_max_frame_size_is_refused_before_it_arrives() -> None:
    server = raw_server()
    events = server.receive(f.HEADER.pack(((f.DEFAULT_FRAME_SIZE + 1) << 8) | f.DATA, 0, 1))
    assert events[0].code == f.FRAME_SIZE_ERROR


# ---- stream ids, concurrency, goaway ----------------------------------------------------------


def test_streams_above_max_concurrent_streams_are_refused() -> None:
    server = raw_server(max_concurrent_streams=2)
    events = server.receive(headers_frame(1, end=False) + headers_frame(3, end=False))
    assert [type(e) for e in events] == [Request, Request]
    assert server.receive(headers_frame(5, end=False)) == []
    refused = frames_of(server.data_to_send())
    assert [(k, s, p) for k, _fl, s, p in refused] == \
        [(f.RST_STREAM, 5, struct.pack(">I", f.REFUSED_STREAM))]
    server.receive(f.rst_stream(1, f.CANCEL))
    assert [type(e) for e in server.receive(headers_frame(7))] == [Request]
    assert server.open_streams == 2


def test_hpack_state_is_kept_across_refused_streams() -> None:
    server = raw_server(max_concurrent_streams=1)
    encoder = hpack.Encoder()  # one encoder: later blocks refer to its dynamic table
    server.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(REQUEST)))
    server.receive(f.frame(f.HEADERS, f.END_HEADERS, 3, encoder.encode(REQUEST)))  # refused
    server.receive(f.rst_stream(1, f.CANCEL))
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS, 5, encoder.encode(REQUEST)))
    assert events == [Request(5, REQUEST, False)]


@pytest.mark.parametrize("first,second", [(1, 2), (3, 1), (5, 3), (7, 4)])
def test_even_or_decreasing_stream_ids_are_protocol_errors(first: int, second: int) -> None:
    server = raw_server()
    server.receive(headers_frame(first))
    # without END_STREAM: a lower id so ended could be a reset stream's trailers (ignored)
    events = server.receive(headers_frame(second, end=False))
    assert [type(e) for e in events] == [Closed] and events[0].code == f.PROTOCOL_ERROR
    assert goaway_code(server.data_to_send()) == f.PROTOCOL_ERROR


@pytest.mark.parametrize("bad", [
    f.frame(f.HEADERS, f.END_HEADERS, 0, b""),
    f.frame(f.DATA, 0, 0, b""),
    f.frame(f.DATA, 0, 9, b"idle"),
    f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\2"),
    f.frame(f.PRIORITY, 0, 0, b"\0" * 5),
    f.frame(f.RST_STREAM, 0, 0, b"\0" * 4),
    f.frame(f.WINDOW_UPDATE, 0, 0, b"\0" * 4),
    f.frame(f.WINDOW_UPDATE, 0, 0, b"\0" * 3),
])
def test_malformed_frames_are_connection_errors(bad: bytes) -> None:
    server = raw_server()
    events = server.receive(bad)
    assert [type(e) for e in events] == [Closed]
    assert goaway_code(server.data_to_send()) == events[0].code != f.NO_ERROR


def test_unknown_frame_types_and_priority_are_ignored() -> None:
    server = raw_server()
    assert server.receive(f.frame(0x42, 0xFF, 0, b"whatever")
                          + f.frame(f.PRIORITY, 0, 1, b"\0" * 5)) == []
    assert not server.closed


def test_goaway_refuses_new_streams_and_lets_open_ones_finish() -> None:
    pair = Pair()
    sid = pair.open(end=True)
    pair.server.goaway()
    pair.server.goaway()  # said once
    pair.pump()
    goaways = pair.take(ev.ConnectionTerminated)
    assert len(goaways) == 1 and goaways[0].last_stream_id == sid
    assert goaways[0].error_code == f.NO_ERROR
    server = pair.server
    assert server.receive(headers_frame(sid + 2)) == []
    assert (f.RST_STREAM, sid + 2, struct.pack(">I", f.REFUSED_STREAM)) in \
        [(k, s, p) for k, _fl, s, p in frames_of(server.data_to_send())]
    server.send_headers(sid, HEAD + TRAILERS, end_stream=True)
    out = frames_of(server.data_to_send())
    assert [(k, s) for k, _fl, s, _p in out] == [(f.HEADERS, sid)]
    assert server.open_streams == 0


def test_the_table_size_update_precedes_the_first_block_and_follows_a_change() -> None:
    server = raw_server()
    server.receive(headers_frame(1) + headers_frame(3, fields=REQUEST))
    server.send_headers(1, HEAD)
    server.send_headers(3, HEAD)
    blocks = [p for k, _fl, _s, p in frames_of(server.data_to_send()) if k == f.HEADERS]
    assert blocks[0].startswith(f.TABLE_SIZE_ZERO) and blocks[1] == HEAD
    server.receive(f.settings({f.HEADER_TABLE_SIZE: 100}) + headers_frame(5))
    server.send_headers(5, HEAD)
    blocks = [p for k, _fl, _s, p in frames_of(server.data_to_send()) if k == f.HEADERS]
    assert blocks == [f.TABLE_SIZE_ZERO + HEAD]


# ---- faults found (each test failed before its fix) ------------------------------------------


def drain_to_trailers(pair: Pair, sid: int) -> bytes:
    """Acknowledge what arrives on ``sid`` until its trailers come (bounded); the data."""
    got = b""
    for _ in range(200):
        got += pair.received(sid)
        if any(isinstance(e, ev.TrailersReceived) for e in pair.client_events):
            return got
        pair.pump()
    raise AssertionError(f"no trailers; {len(got)} bytes of data")


def test_output_waiting_on_the_window_survives_the_peer_ending_its_side() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 10})
    sid = pair.open()
    body = bytes(range(100))
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, body)
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    pair.pump()
    pair.client.end_stream(sid)  # the peer ends while the reply still waits for its window
    pair.pump()
    assert pair.server_events[-1] == Data(sid, b"", True)
    assert drain_to_trailers(pair, sid) == body
    assert pair.server.open_streams == 0


def test_output_ended_by_data_survives_the_peer_ending_its_side() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 10})
    sid = pair.open()
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, b"x" * 50, end_stream=True)
    pair.pump()
    pair.client.end_stream(sid)
    pair.pump()
    got = b""
    for _ in range(20):
        got += pair.received(sid)
        pair.pump()
    assert got == b"x" * 50 and pair.take(ev.StreamEnded)
    assert pair.server.open_streams == 0


@pytest.mark.parametrize("increment,code", [(0, f.PROTOCOL_ERROR),
                                            (2**31 - 1, f.FLOW_CONTROL_ERROR)])
def test_a_stream_reset_over_its_window_update_is_reported(increment: int, code: int) -> None:
    server = raw_server()
    server.receive(headers_frame(1, end=False))
    events = server.receive(f.window_update(1, increment))
    assert events == [Reset(1, code)]  # else the handler would wait for a stream now gone
    assert (f.RST_STREAM, 1, struct.pack(">I", code)) in \
        [(k, s, p) for k, _fl, s, p in frames_of(server.data_to_send())]
    assert server.open_streams == 0


def test_trailers_on_a_stream_the_server_reset_are_ignored() -> None:
    server = raw_server(max_concurrent_streams=1)
    encoder = hpack.Encoder()  # the peer's: its table must stay in step with our decoder
    server.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(REQUEST)))
    server.reset(1)
    trailers = encoder.encode([(b"x-trailer", b"late")])
    assert server.receive(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, trailers)) == []
    server.receive(f.frame(f.HEADERS, f.END_HEADERS, 3, encoder.encode(REQUEST)))
    server.receive(f.frame(f.HEADERS, f.END_HEADERS, 5, encoder.encode(REQUEST)))  # refused
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 5,
                                    encoder.encode([(b"x-trailer", b"late")])))
    assert events == [] and not server.closed  # the connection (Envoy's streams) lives on
    server.receive(f.rst_stream(3, f.CANCEL))
    fields = REQUEST + [(b"x-trailer", b"late")]
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS, 7, encoder.encode(fields)))
    assert events == [Request(7, fields, False)]


def test_a_continuation_flood_is_cut() -> None:
    limit = 1 << 14
    server = raw_server(max_header_list_size=limit)
    fragment = b"\x00" * f.DEFAULT_FRAME_SIZE
    events = server.receive(f.frame(f.HEADERS, 0, 1, fragment))
    fed = len(fragment)
    while not events and fed < 1000 * limit:
        events = server.receive(f.frame(f.CONTINUATION, 0, 1, fragment))
        fed += len(fragment)
    assert [type(e) for e in events] == [Closed]
    assert fed <= 4 * limit  # the block was not kept growing
    assert goaway_code(server.data_to_send()) is not None


def test_finish_waits_for_pending_output_then_stops_the_peer() -> None:
    pair = Pair({S.INITIAL_WINDOW_SIZE: 10})
    sid = pair.open()
    pair.server.send_headers(sid, HEAD)
    pair.server.send_data(sid, b"y" * 100)
    pair.server.send_headers(sid, TRAILERS, end_stream=True)
    pair.server.finish(sid)  # the peer is still sending; the reply still waits
    pair.pump()
    assert not pair.take(ev.StreamReset)
    assert drain_to_trailers(pair, sid) == b"y" * 100
    pair.pump()
    assert [e.error_code for e in pair.take(ev.StreamReset)] == [f.NO_ERROR]
    assert pair.server.open_streams == 0


def test_a_settings_change_overflowing_a_stream_window_is_a_flow_control_error() -> None:
    server = raw_server()
    server.receive(headers_frame(1, end=False))
    assert server.receive(f.window_update(1, f.MAX_WINDOW - f.DEFAULT_WINDOW)) == []
    events = server.receive(f.settings({f.INITIAL_WINDOW_SIZE: f.DEFAULT_WINDOW + 1}))
    assert [type(e) for e in events] == [Closed] and events[0].code == f.FLOW_CONTROL_ERROR


def test_a_remembered_header_block_decodes_anew_once_the_table_changes() -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    # Stream 1 inserts x-a into the dynamic table; streams 3 and 7 send the same bytes, an
    # indexed reference to the newest entry, which stream 5 changes (it inserts x-b).
    first = encoder.encode(REQUEST + [(b"x-tag", b"a")])
    newest = b"\xbe"  # indexed field 62: the dynamic table's newest entry
    # (the request's own fields as literals: only the x-tag reference moves with the table)
    block = b"".join(f.literal(name, value) for name, value in REQUEST) + newest
    inserts_b = encoder.encode(REQUEST + [(b"x-tag", b"b")])
    tags = []
    for sid, payload in ((1, first), (3, block), (5, inserts_b), (7, block), (9, block)):
        (event,) = pair.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, payload))
        assert isinstance(event, Request)
        tags.append(dict(event.headers)[b"x-tag"])
    assert tags == [b"a", b"a", b"b", b"b", b"b"]
