"""HPACK decoding of one connection's header blocks, remembering the blocks that repeat.

Decoding is a function of the block and the dynamic table, and a block that leaves the table
as it was does not change it: the same bytes decode the same way until something does.
Envoy's ext_proc streams all open with one such block (the method path as a literal without
indexing, the rest indexed), whose decoding was 15 % of the service's CPU per request. What
is remembered is bounded in bytes, not only in count: a peer sending large distinct blocks
must not pin megabytes per connection.
"""

from __future__ import annotations

from typing import cast

import hpack

Headers = list[tuple[bytes, bytes]]

KEPT_BLOCKS = 64  # distinct table-neutral blocks remembered per connection, at most
KEPT_BYTES = 64 << 10  # ... and at most this many bytes of them (block + decoded fields)
FIELD_OVERHEAD = 32  # RFC 7541 §4.1's per-field overhead, a fair estimate of Python's too


class DecodingError(Exception):
    """The block does not decode (a connection error: the shared table is now unknown)."""


class HeaderBlocks:
    """One connection's HPACK decoder and its remembered table-neutral blocks."""

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size)
        self._kept: dict[bytes, Headers] = {}
        self._kept_bytes = 0

    def decode(self, block: bytes) -> tuple[Headers, bool]:
        """The fields of ``block`` (raw bytes), and whether it was decoded anew (False: from
        memory, a remembered one)."""
        headers = self._kept.get(block)
        if headers is not None:
            return headers, False
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
