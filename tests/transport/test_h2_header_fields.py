"""Header blocks weighed by their fields (extproc/transport/headerblocks.py, connection.py):
an indexed field is one byte that decodes to a name and a value, so a block small in bytes
can be thousands of fields. Counted in events, frames and refusals, never in time."""

from __future__ import annotations

import hpack
from test_h2_calm import Clock, goaways, refused_with_431_alone, server_on
from test_h2_connection import REQUEST

from extproc.transport import frames as f
from extproc.transport.connection import FIELDS_DECODED, MAX_HEADER_FIELDS
from extproc.transport.h2events import Closed
from extproc.transport.headerblocks import count_fields

COOKIE = b"\xa0"  # static table entry 32, "cookie" with no value: 1 byte, 38 decoded


def block_of(sid: int, fields: int) -> bytes:
    """A request's block (its own, never remembered) and ``fields`` one-byte regular fields."""
    return (hpack.Encoder().encode(REQUEST + [(b"x-n", b"%d" % sid)])
            + COOKIE * fields)


def test_fields_are_counted_without_decoding() -> None:
    encoder = hpack.Encoder()
    for fields in ([], REQUEST, REQUEST + [(b"x-%d" % i, b"v" * i) for i in range(200)]):
        for huffman in (True, False):
            block = encoder.encode(fields, huffman=huffman)
            assert count_fields(block, 1000) == len(fields)
    assert count_fields(b"\x84" * 1500, 512) == 513  # it stops past the limit


def test_a_list_of_too_many_fields_is_refused_on_its_stream_alone() -> None:
    server = server_on(Clock())
    fields = MAX_HEADER_FIELDS + 20  # ~11 KB decoded: within the byte limit
    assert server.receive(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1,
                                  block_of(1, fields))) == []
    refused_with_431_alone(server)


def test_a_block_of_thousands_of_one_byte_fields_ends_its_connection_undecoded() -> None:
    server = server_on(Clock())
    block = b"\x84" * 1500  # ":path: /" 1,500 times: 1.5 KB, 57 KB decoded
    events = server.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, block))
    assert [e.code for e in events if isinstance(e, Closed)] == [f.ENHANCE_YOUR_CALM]
    assert [code for _last, code in goaways(server.data_to_send())] == [f.ENHANCE_YOUR_CALM]


def test_a_block_weighs_on_the_turn_by_its_fields() -> None:
    server = server_on(Clock())
    data = b"".join(f.frame(f.HEADERS, f.END_HEADERS, sid, block_of(sid, MAX_HEADER_FIELDS - 10))
                    for sid in range(1, 21, 2))  # ten lists of ~250 fields, ~260 bytes each
    first = server.receive(data, max_frames=256)
    assert len(first) == 1 and server.backlog  # one block's fields fill the turn
    events, turns = first, 1
    while server.backlog:
        events += server.receive(b"", max_frames=256)
        turns += 1
    assert [e.stream_id for e in events] == list(range(1, 21, 2))  # none lost
    assert turns >= 15  # each block's work past its turn waited the next one out (~2 each)


def test_list_after_list_of_too_many_fields_ends_the_connection() -> None:
    server = server_on(Clock())
    refused = 0
    for sid in range(1, 201, 2):
        events = server.receive(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid,
                                        block_of(sid, FIELDS_DECODED - 10)))
        if any(isinstance(e, Closed) for e in events):
            break
        refused += 1
    assert server.closed and 1 <= refused < 20  # each one's work drew on the control budget
