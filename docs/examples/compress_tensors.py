"""Compressing a batch of tensors with p2p-compress alone, in three lines.

Runs on its own: ``python docs/examples/compress_tensors.py``. No networking: the
tensors are compressed into pooled buffers and restored, byte for byte.
"""

from __future__ import annotations

import torch

from p2p_compress import compress_tensors, decompress_tensors, parse_tensor_compression

torch.manual_seed(0)
batch = {
    "token_ids": torch.randint(0, 32000, (65536,), dtype=torch.int64),
    "attention_mask": torch.ones(65536, dtype=torch.bool),
    "logits": torch.randn(16384),  # float32: random, hard to compress
}


def main() -> None:
    # With a codec name, every CPU tensor is tried and kept compressed if it shrinks.
    with compress_tensors(batch, "zstd") as packed:  # buffers go back to the pool on exit
        print(f"{packed.codec_name}: {packed.raw_bytes} -> {packed.wire_bytes} bytes")
        for key, item in zip(packed.keys or (), packed.items, strict=True):
            print(f"  {key}: {item.raw_bytes} -> {item.wire_bytes} ({item.reason or 'compressed'})")
        restored = decompress_tensors(packed, timeout=10.0)
    assert all(torch.equal(restored[k], batch[k]) for k in batch)  # lossless
    assert packed.wire_bytes < packed.raw_bytes

    # A full configuration applies min_bytes and excluded_dtypes as on the wire.
    config = parse_tensor_compression({"codec": "lz4", "excluded_dtypes": ["float32"]})
    assert config is not None
    with compress_tensors(batch, config) as packed:
        reasons = {k: item.reason for k, item in zip(batch, packed.items, strict=True)}
        restored = packed.decompress(timeout=10.0)
    assert reasons["logits"] == "excluded_dtype"
    assert all(torch.equal(restored[k], batch[k]) for k in batch)
    print("compress_tensors: ok")


if __name__ == "__main__":
    main()
