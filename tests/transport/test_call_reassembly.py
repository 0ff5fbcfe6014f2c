"""gRPC messages gathered from DATA frames (extproc/transport/call.py, ``Call.feed``): whole
messages whatever the cut, a refusal past the limit, and memory linear in the message with a
small factor however it is cut (one copy when it is whole; small parts not kept one by one)."""

from __future__ import annotations

import asyncio
import struct
import tracemalloc
from dataclasses import dataclass, field

import grpc
import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.transport import frames as f
from extproc.transport.call import EOF, Call
from extproc.transport.connection import ServerConnection

LIMIT = 4 << 20


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/t.S/Echo"),
           (b":authority", b"t"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def opened() -> ServerConnection:
    """A connection with stream 1 open, as a peer's preface and HEADERS leave it."""
    conn = ServerConnection()
    conn.receive(f.PREFACE + f.frame(f.SETTINGS, 0, 0, b"")
                 + f.frame(f.HEADERS, f.END_HEADERS, 1, hpack.Encoder().encode(REQUEST)))
    conn.data_to_send()
    return conn


@dataclass
class Link:
    """The connection side a call needs: a real ServerConnection, no socket."""

    loop: asyncio.AbstractEventLoop
    conn: ServerConnection = field(default_factory=opened)
    calls: dict[int, Call] = field(default_factory=dict)
    flushes: int = 0

    def schedule_flush(self) -> None:
        """Counted only: nothing is written here."""
        self.flushes += 1

    async def flushed(self) -> None:
        """Nothing waits here."""

    async def unblocked(self, sid: int) -> None:
        """Nothing waits here."""


def framed(messages: list[bytes]) -> bytes:
    """The request stream's bytes: each message behind its 5-byte prefix."""
    return b"".join(struct.pack(">BI", 0, len(m)) + m for m in messages)


def fed(stream: bytes, cuts: list[int], limit: int = LIMIT) -> tuple[list[bytes], Call]:
    """Feed ``stream`` cut at ``cuts`` (the last piece ends it); the messages read back."""
    async def go() -> tuple[list[bytes], Call]:
        call = Call(Link(asyncio.get_running_loop()), 1, None, None)
        edges = [0, *sorted(set(c for c in cuts if 0 < c < len(stream))), len(stream)]
        for i, (a, b) in enumerate(zip(edges, edges[1:])):
            call.feed(stream[a:b], i == len(edges) - 2, limit)
        if len(edges) == 2 and not stream:
            call.feed(b"", True, limit)
        read = []
        while not call._finished:  # noqa: SLF001 (a refused call has nothing to read)
            message = await call.read()
            if message is EOF:
                break
            read.append(message)
        return read, call
    return asyncio.run(go())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=4000, max_size=9000)),
                max_size=6),
       st.lists(st.integers(min_value=0, max_value=60_000), max_size=40))
def test_every_cut_of_the_stream_reads_back_the_same_messages(messages: list[bytes],
                                                               cuts: list[int]) -> None:
    read, _call = fed(framed(messages), cuts)
    assert read == messages
    assert all(type(m) is bytes for m in read)


def test_one_byte_frames_read_back_the_message() -> None:
    message = bytes(range(256)) * 40
    stream = framed([message, b"", b"x"])
    read, _call = fed(stream, list(range(len(stream))))
    assert read == [message, b"", b"x"]


def test_a_message_past_the_limit_is_refused_with_resource_exhausted() -> None:
    stream = framed([b"a" * 100, b"b" * 5000])
    _read, call = fed(stream, [50, 103, 110, 2000], limit=1000)
    sent = call._protocol.conn.data_to_send()  # noqa: SLF001 (the link is this test's)
    blocks, at = [], 0
    while at < len(sent):
        length, kind = int.from_bytes(sent[at:at + 3], "big"), sent[at + 3]
        if kind == f.HEADERS:
            blocks.append(sent[at + 9:at + 9 + length])
        at += 9 + length
    headers = dict(hpack.Decoder().decode(blocks[-1]))
    assert headers["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])


def peak_while_feeding(size: int, step: int) -> tuple[int, list[bytes]]:
    """Bytes allocated at the peak while one ``size``-byte message is fed in ``step``-byte
    frames (the frames themselves made beforehand, outside the count)."""
    stream = framed([b"z" * size])
    pieces = [stream[a:a + step] for a in range(0, len(stream), step)]

    async def go() -> list[bytes]:
        call = Call(Link(asyncio.get_running_loop()), 1, None, None)
        tracemalloc.start()
        for i, piece in enumerate(pieces):
            call.feed(piece, i == len(pieces) - 1, 1 << 30)
        return [await call.read()]

    del stream
    try:
        read = asyncio.run(go())
        return tracemalloc.get_traced_memory()[1], read
    finally:
        tracemalloc.stop()


def test_a_large_message_in_frames_is_copied_once() -> None:
    size = 8 << 20
    peak, read = peak_while_feeding(size, 16 << 10)
    assert read[0] == b"z" * size
    # its frames (kept until it is whole) and the one joined copy: growing a buffer per frame
    # and cutting the message out of it held three sizes and more at the peak
    assert peak < 2.2 * size, peak


def test_a_message_in_one_byte_frames_takes_about_its_size() -> None:
    size = 256 << 10
    peak, read = peak_while_feeding(size, 1)
    assert read[0] == b"z" * size
    assert peak < 2.5 * size, peak  # (a list of one-byte parts: 8 bytes of pointer each)
