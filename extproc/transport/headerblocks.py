"""HPACK decoding of one connection's header blocks, remembering the blocks that repeat.

Decoding is a function of the block and the dynamic table, and a block that leaves the table
as it was does not change it: the same bytes decode the same way until something does.
Envoy's ext_proc streams all open with one such block (the method path as a literal without
indexing, the rest indexed), whose decoding was 15 % of the service's CPU per request. What
is remembered is bounded in bytes, not only in count: a peer sending large distinct blocks
must not pin megabytes per connection.

A block's cost is its fields more than its bytes: an indexed field is one byte that decodes
to a name and a value (RFC 7541 §6.1), so 1.5 KB can be 1,500 fields. ``count_fields`` counts
them without decoding, from the field representations' prefixes and string lengths alone, so
that a block of too many fields is turned away before the decoder spends time on it.
"""

from __future__ import annotations

import re
from typing import cast

import hpack

Headers = list[tuple[bytes, bytes]]

KEPT_BLOCKS = 64  # distinct table-neutral blocks remembered per connection, at most
KEPT_BYTES = 64 << 10  # ... and at most this many bytes of them (block + decoded fields)
FIELD_OVERHEAD = 32  # RFC 7541 §4.1's per-field overhead, a fair estimate of Python's too
_ONE_BYTE_INDEXED = re.compile(rb"[\x80-\xfe]+")  # indexed fields of an index under 127


def _integer(block: bytes, at: int, prefix: int) -> tuple[int, int]:
    """The integer of ``prefix`` bits at ``at`` (RFC 7541 §5.1) and where what follows starts
    (past the end when the block is cut short)."""
    value = block[at] & ((1 << prefix) - 1)
    at += 1
    if value < (1 << prefix) - 1:
        return value, at
    shift = 0
    while at < len(block) and shift < 35:  # (longer is not an integer HPACK decodes)
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
    return value, len(block) + 1


def _string(block: bytes, at: int) -> int:
    """Where the string literal at ``at`` ends (§5.2)."""
    if at >= len(block):
        return at + 1
    length, at = _integer(block, at, 7)
    return at + length


def count_fields(block: bytes, limit: int) -> int:
    """The fields ``block`` encodes, counted up to ``limit + 1`` at most (a block that does
    not parse counts what came before the fault: the decoder then refuses it)."""
    count = at = 0
    end = len(block)
    while at < end and count <= limit:
        first = block[at]
        if first & 0x80:  # indexed (§6.1); an index under 127 is the byte itself
            if first == 0xFF:
                at = _integer(block, at, 7)[1]
            else:  # a run of such fields (a block of one-byte fields) at the regex's speed
                run = _ONE_BYTE_INDEXED.match(block, at).end()  # type: ignore[union-attr]
                count += run - at
                at = run
                continue
        elif first & 0x40 or not first & 0x20:  # literals (§6.2)
            index, at = _integer(block, at, 6 if first & 0x40 else 4)
            if not index:
                at = _string(block, at)
            at = _string(block, at)
        else:  # a dynamic table size update (§6.3): no field
            _, at = _integer(block, at, 5)
            continue
        count += 1
    return min(count, limit + 1)


class DecodingError(Exception):
    """The block does not decode (a connection error: the shared table is now unknown)."""


class TooManyFields(DecodingError):
    """The block has more fields than the connection decodes (not decoded: a connection
    error as well, the shared table being unknown once a block is skipped)."""


class HeaderBlocks:
    """One connection's HPACK decoder and its remembered table-neutral blocks."""

    def __init__(self, max_header_list_size: int, max_fields: int = 1 << 16) -> None:
        self._decoder = hpack.Decoder(max_header_list_size)
        self._max_fields = max_fields
        self._kept: dict[bytes, Headers] = {}
        self._kept_bytes = 0

    def decode(self, block: bytes) -> tuple[Headers, bool]:
        """The fields of ``block`` (raw bytes), and whether it was decoded anew (False: from
        memory, a remembered one); TooManyFields past ``max_fields``, before decoding."""
        headers = self._kept.get(block)
        if headers is not None:
            return headers, False
        # (a field is a byte at least: a block no longer than the limit needs no count)
        if len(block) > self._max_fields and count_fields(block, self._max_fields) > \
                self._max_fields:
            raise TooManyFields(f"over {self._max_fields} fields")
        table = self._decoder.header_table
        before = (len(table.dynamic_entries), table.dynamic_entries[0]
                  if table.dynamic_entries else None, table.maxsize)
        try:
            headers = cast(Headers, self._decoder.decode(block, raw=True))  # a list, typed loosely
        except hpack.HPACKError as exc:
            raise DecodingError(str(exc)) from exc
        after = (len(table.dynamic_entries), table.dynamic_entries[0]
                 if table.dynamic_entries else None, table.maxsize)
        if after[0] != before[0] or after[1] is not before[1] or after[2] != before[2]:
            self._kept.clear()  # the table changed: what was remembered may decode anew
            self._kept_bytes = 0
            return headers, True
        size = len(block) + sum(len(k) + len(v) + FIELD_OVERHEAD for k, v in headers)
        if len(self._kept) < KEPT_BLOCKS and self._kept_bytes + size <= KEPT_BYTES:
            self._kept[block] = headers
            self._kept_bytes += size
        return headers, True
