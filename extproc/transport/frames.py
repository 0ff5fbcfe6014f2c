"""HTTP/2 frames (RFC 9113 §4, §6): the 9-byte header, the types and flags a server meets,
and the encoders for what this server sends.

Nothing here keeps state; ``connection.py`` does. Header blocks the server sends are
encoded without the HPACK dynamic table (RFC 7541 §6.2.2, "literal without indexing"), so
the encoder has no state to keep in step with Envoy's decoder either.
"""

from __future__ import annotations

import struct

from .h2events import ConnectionError_

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER = struct.Struct(">I B I")  # 24-bit length packed with the type byte, flags, stream id
HEADER_SIZE = 9

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)

END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Error codes (§7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, \
    STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = range(10)
ENHANCE_YOUR_CALM = 0xB  # a peer's flood (RFC 9113 §7), as nghttp2 and Envoy answer it

# Settings (§6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, \
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_SIZE_LIMIT = 2**24 - 1


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One whole frame."""
    return HEADER.pack((len(payload) << 8) | kind, flags, stream_id) + payload


def settings(values: dict[int, int]) -> bytes:
    """A SETTINGS frame carrying ``values``."""
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    """A WINDOW_UPDATE frame."""
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    """A RST_STREAM frame."""
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    """A GOAWAY frame."""
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) whose first byte carries ``first`` above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return (b"\x00" + _integer(len(name), 7, 0) + name + _integer(len(value), 7, 0) + value)


#: ``:status: 200``, fully indexed (static table entry 8).
STATUS_200 = b"\x88"
#: A dynamic table size update to 0 (§6.3): said before the first block, and again after
#: the peer changes its table size, since this encoder never uses the table.
TABLE_SIZE_ZERO = b"\x20"


def unpadded(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding (§6.1)."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "padding exceeds the frame")
    return payload[1:len(payload) - payload[0]]
