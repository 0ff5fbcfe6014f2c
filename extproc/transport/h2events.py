"""What one HTTP/2 connection tells its owner (``connection.ServerConnection.receive``)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Closed", "ConnectionError_", "Data", "Event", "Request", "Reset"]


class Request(NamedTuple):
    """A stream opened by the peer: its header fields, and whether it already ended."""

    stream_id: int
    headers: list[tuple[bytes, bytes]]
    ended: bool


class Data(NamedTuple):
    """Bytes on a stream, and whether the peer ended its side with them."""

    stream_id: int
    data: bytes
    ended: bool


class Reset(NamedTuple):
    """The peer reset a stream (RST_STREAM)."""

    stream_id: int
    code: int


class Closed(NamedTuple):
    """The connection is over: a protocol error on the peer's side (said in a GOAWAY)."""

    code: int
    why: str


# Anything ``receive`` returns.
Event = Request | Data | Reset | Closed


class ConnectionError_(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why
