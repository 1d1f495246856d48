"""Compressing CPU tensors with p2p-compress alone: no networking involved.

Runs on its own: ``python docs/examples/compress_standalone.py``. It walks the same
steps a sender and a receiver take on the wire: plan (compress eligible tensors into
pooled buffers), "send" the payloads, decompress straight into preallocated targets,
release the buffers.
"""

from __future__ import annotations

import torch

from p2p_compress import (
    TensorBufferPool,
    TensorCodecProvider,
    decompress_into_tensor,
    parse_tensor_buffer_pool,
    parse_tensor_compression,
    plan_compression,
)


def main() -> None:
    config = parse_tensor_compression({"codec": "lz4", "min_bytes": 16384})
    assert config is not None
    pool = TensorBufferPool(max_bytes=parse_tensor_buffer_pool(None).max_bytes)
    provider = TensorCodecProvider(config)

    torch.manual_seed(0)
    tensors = [
        torch.randint(0, 100, (32768,), dtype=torch.int64),  # token ids: compress well
        torch.randint(0, 256, (65536,), dtype=torch.uint8),  # random bytes: do not shrink
        torch.randn(16384),  # float32: excluded by default
        torch.arange(100, dtype=torch.int64),  # 800 bytes: below min_bytes
    ]

    # Sender side: one entry per tensor, in order; the codec is already released.
    plan = plan_compression(tensors, config, provider, pool)
    for entry in plan.entries:
        print(
            f"codec_id={entry.codec_id} raw={entry.raw_bytes} wire={entry.wire_bytes} "
            f"reason={entry.reason or 'compressed'}"
        )
    reasons = [entry.reason for entry in plan.entries]
    assert reasons == ["", "not_smaller", "excluded_dtype", "below_min_bytes"], reasons
    assert plan.entries[0].wire_bytes < plan.entries[0].raw_bytes

    # Receiver side: the target tensors are allocated from the metadata (dtype, shape),
    # and compressed payloads are decompressed straight into them.
    for tensor, entry in zip(tensors, plan.entries, strict=True):
        target = torch.empty_like(tensor)
        if entry.codec_id == 0:  # raw on the wire
            target.copy_(entry.payload)
        else:
            decompress_into_tensor(entry.codec_id, entry.payload, target, provider, timeout=10.0)
        assert torch.equal(target, tensor)  # lossless, byte for byte

    # After the payloads' sends completed, the leases go back to the pool (idempotent).
    plan.release_all()
    stats = pool.stats()
    assert stats["active_bytes"] == 0
    print(f"pool: {stats}")
    print("compress_standalone: ok")


if __name__ == "__main__":
    main()
