"""Remembered header blocks (extproc/transport/headerblocks.py): bounded in bytes, and a
remembered block decodes as a fresh decoding would."""

from __future__ import annotations

import hpack

from extproc.transport import headerblocks
from extproc.transport.headerblocks import HeaderBlocks


def neutral(value: bytes) -> bytes:
    """A block that leaves the dynamic table as it was (a never-indexed literal)."""
    return hpack.Encoder().encode([(b"x-big", value, True)])


def test_large_distinct_blocks_are_remembered_within_the_byte_bound() -> None:
    blocks = HeaderBlocks(1 << 20)
    for i in range(40):
        block = neutral(bytes([65 + i % 26]) * 8000 + str(i).encode())
        assert blocks.decode(block) == ([(b"x-big", block_value(block))], True)
    assert blocks._kept_bytes <= headerblocks.KEPT_BYTES  # noqa: SLF001 (the bound itself)
    assert 0 < len(blocks._kept) < 40  # noqa: SLF001


def block_value(block: bytes) -> bytes:
    """What a fresh decoder reads out of ``block``."""
    return hpack.Decoder(1 << 20).decode(block, raw=True)[0][1]


def test_a_remembered_block_decodes_the_same_until_the_table_changes() -> None:
    blocks = HeaderBlocks(1 << 16)
    block = neutral(b"v")
    first, decoded = blocks.decode(block)
    assert decoded
    again, decoded = blocks.decode(block)
    assert again is first and not decoded  # remembered
    indexed = hpack.Encoder().encode([(b"x-new", b"1")])  # adds to the dynamic table
    blocks.decode(indexed)
    assert blocks._kept == {}  # noqa: SLF001 (the table changed: nothing is trusted)
    assert blocks.decode(block) == (first, True)
