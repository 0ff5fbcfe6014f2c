"""Tiny llama-architecture GGUF models, made not downloaded: ``python -m devstack.tinymodel``.

Random weights (seeded: the same arguments write the same bytes) and a byte-level
SentencePiece vocabulary (the three specials, the 256 byte tokens and a few words), written
with the ``gguf`` package from the llama.cpp tree the llama-server was built from. llama.cpp
loads them like any model: ``/health``, chat completions, ``/slots``, slot save and restore,
``/metrics``. Their answers are noise, which is all a swap needs.

Sizes: ``tiny`` (2 layers, 64 wide: under 1 MB, loads in a moment) for most tests; ``large``
(many more and wider layers: a load long enough to watch a request wait for it).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

SIZES = {
    # name: (layers, width, feed-forward width, heads)
    "tiny": (2, 64, 128, 4),
    "large": (24, 1024, 2816, 16),
}
WORDS = ["▁", "▁the", "▁a", "▁and", "▁to", "e"]


@dataclass(frozen=True)
class Shape:
    """A model's dimensions."""

    layers: int
    width: int
    ffn: int
    heads: int


def vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    """Tokens, scores and types of the byte-level SPM vocabulary."""
    import gguf

    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>".encode() for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [w.encode() for w in WORDS]
    types += [gguf.TokenType.NORMAL] * len(WORDS)
    scores = [0.0] * 259 + [-float(i) for i in range(1, len(WORDS) + 1)]
    return tokens, scores, [int(t) for t in types]


def write(path: Path, shape: Shape, seed: int = 0, context: int = 2048) -> Path:
    """Write a model of ``shape`` to ``path``; returns ``path``."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"modelpool-tiny-{shape.layers}x{shape.width}")
    writer.add_context_length(context)
    writer.add_embedding_length(shape.width)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(shape.width // shape.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    def tensor(name: str, *dims: int, dtype: type = np.float16, scale: float = 0.02) -> None:
        writer.add_tensor(name, (rng.standard_normal(dims) * scale).astype(dtype))

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(shape.width, dtype=np.float32))

    vocab, width = len(tokens), shape.width
    tensor("token_embd.weight", vocab, width)
    for i in range(shape.layers):
        norm(f"blk.{i}.attn_norm.weight")
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{part}.weight", width, width)
        norm(f"blk.{i}.ffn_norm.weight")
        tensor(f"blk.{i}.ffn_gate.weight", shape.ffn, width)
        tensor(f"blk.{i}.ffn_up.weight", shape.ffn, width)
        tensor(f"blk.{i}.ffn_down.weight", width, shape.ffn)
    norm("output_norm.weight")
    tensor("output.weight", vocab, width)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ensure(directory: Path, size: str) -> Path:
    """The model of ``size`` in ``directory`` (``<size>.gguf``), written if it is not there."""
    path = directory / f"{size}.gguf"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial-{os.getpid()}")
        write(partial, Shape(*SIZES[size]))
        # whole or absent: a reader never sees half a model; of two writers (test workers
        # collecting at once) the last rename wins, and both wrote the same bytes
        os.replace(partial, path)
    return path


def main(argv: list[str] | None = None) -> int:
    """Write the models asked for."""
    parser = argparse.ArgumentParser(prog="python -m devstack.tinymodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size", action="append", choices=sorted(SIZES),
                        help="which (repeatable; default: all)")
    args = parser.parse_args(argv)
    for size in args.size or sorted(SIZES):
        print(ensure(args.directory, size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
