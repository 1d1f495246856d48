"""Many threads compressing and decompressing at once through one provider and pool."""

from __future__ import annotations

import threading

import pytest
import torch

from p2p_compress import (
    Lz4CodecConfig,
    TensorBufferPool,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodecConfig,
    decompress_into_tensor,
    make_synthetic_tensor,
    plan_compression,
)


@pytest.mark.parametrize(
    "codec", [Lz4CodecConfig(), ZstdCodecConfig(level=1, max_inflight=3)], ids=["lz4", "zstd"]
)
def test_concurrent_senders_and_receivers(codec: Lz4CodecConfig | ZstdCodecConfig) -> None:
    config = TensorCompressionConfig(codec=codec, min_bytes=1024, excluded_dtypes=())
    provider = TensorCodecProvider(config)
    pool = TensorBufferPool(4 << 20)
    kinds = ["sparse_float32", "int64_token_ids", "bool_mask", "repeated", "random_float32"]
    payloads = [make_synthetic_tensor(k, 96 * 1024, seed=i) for i, k in enumerate(kinds)]
    errors: list[BaseException] = []
    counts = {"compressed": 0, "raw": 0}
    lock = threading.Lock()
    start = threading.Barrier(10)

    def worker(k: int) -> None:
        try:
            start.wait(timeout=60)
            for i in range(25):
                tensors = [payloads[(k + i) % 5], payloads[(k + 2 * i) % 5]]
                with plan_compression(tensors, config, provider, pool) as plan:
                    for entry, t in zip(plan.entries, tensors, strict=True):
                        out = torch.empty_like(t)
                        decompress_into_tensor(
                            entry.codec_id, entry.payload, out, provider, timeout=60
                        )
                        assert torch.equal(out, t)
                        with lock:
                            counts["compressed" if entry.compressed else "raw"] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors[0]
    assert counts["compressed"] + counts["raw"] == 10 * 25 * 2
    assert counts["compressed"] > 0
    s = pool.stats()
    assert s["active_bytes"] == 0
    assert s["cached_bytes"] <= pool.max_bytes
    if isinstance(codec, ZstdCodecConfig):
        ps = provider.stats()
        assert ps["created"] <= 3
        assert ps["in_use"] == 0
        assert ps["waiting"] == 0
