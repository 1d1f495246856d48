"""plan_compression (seed 000 sender steps 1-5) and decompress_into_tensor."""

from __future__ import annotations

import pytest
import torch
from conftest import raw_bytes

from p2p_compress import (
    LZ4_MAX_INPUT_SIZE,
    RAW_REASONS,
    CompressionError,
    CompressionTimeoutError,
    Lz4CodecConfig,
    TensorBufferPool,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodecConfig,
    decompress_into_tensor,
    plan_compression,
)
from p2p_compress.internal import CODEC_LZ4, CODEC_RAW, CODEC_ZSTD

LZ4 = TensorCompressionConfig(
    codec=Lz4CodecConfig(), min_bytes=1024, excluded_dtypes=(torch.float32,)
)
ZSTD = TensorCompressionConfig(
    codec=ZstdCodecConfig(level=3, max_inflight=1), min_bytes=1024, excluded_dtypes=()
)


def zeros(n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype)


def noise(nbytes: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )


def test_reasons_constant() -> None:
    assert RAW_REASONS == (
        "disabled",
        "not_cpu",
        "below_min_bytes",
        "excluded_dtype",
        "codec_busy",
        "unsupported_size",
        "no_buffer",
        "not_smaller",
    )


@pytest.mark.parametrize(
    "config", [None, TensorCompressionConfig(codec=Lz4CodecConfig(), enabled=False)]
)
def test_disabled_keeps_everything_raw(config: TensorCompressionConfig | None) -> None:
    provider, pool = TensorCodecProvider(Lz4CodecConfig()), TensorBufferPool(1 << 20)
    tensors = [zeros(10_000), torch.ones(3)]
    plan = plan_compression(tensors, config, provider, pool)
    assert [(e.codec_id, e.reason) for e in plan.entries] == [(0, "disabled"), (0, "disabled")]
    assert plan.entries[0].payload is tensors[0]
    assert (plan.entries[0].raw_bytes, plan.entries[0].wire_bytes) == (80_000, 80_000)
    assert pool.stats()["misses"] == 0


def test_filters_and_compression_in_order() -> None:
    provider, pool = TensorCodecProvider(LZ4), TensorBufferPool(1 << 20)
    tensors = [
        zeros(4096),  # compressed
        torch.ones(10, device="meta"),  # not CPU
        zeros(100),  # 800 bytes < 1024
        torch.zeros(4096),  # float32 excluded
        noise(8192),  # incompressible: not smaller
        zeros(2048, torch.bfloat16),  # compressed
    ]
    plan = plan_compression(tensors, LZ4, provider, pool)
    got = [(e.codec_id, e.reason) for e in plan.entries]
    assert got == [
        (CODEC_LZ4, ""),
        (CODEC_RAW, "not_cpu"),
        (CODEC_RAW, "below_min_bytes"),
        (CODEC_RAW, "excluded_dtype"),
        (CODEC_RAW, "not_smaller"),
        (CODEC_LZ4, ""),
    ]
    first = plan.entries[0]
    assert first.compressed
    assert first.raw_bytes == 32768
    assert 0 < first.wire_bytes < 32768
    assert first.payload.dtype == torch.uint8
    assert first.payload.numel() == first.wire_bytes
    assert first.lease is not None
    assert first.payload.data_ptr() == first.lease.buffer.data_ptr()
    for i in (1, 2, 3, 4):
        assert plan.entries[i].payload is tensors[i]
        assert plan.entries[i].wire_bytes == plan.entries[i].raw_bytes
    # the not-smaller buffer was discarded, not cached; two leases remain active
    s = pool.stats()
    assert (s["discards"], s["cached_bytes"], s["active_buffers"]) == (1, 0, 2)
    assert plan.raw_bytes == sum(e.raw_bytes for e in plan.entries)
    assert plan.wire_bytes < plan.raw_bytes
    for entry, t in zip(plan.entries, tensors, strict=True):
        if t.is_cpu:
            out = torch.empty_like(t)
            decompress_into_tensor(entry.codec_id, entry.payload, out, provider, timeout=10)
            assert raw_bytes(out) == raw_bytes(t)
    plan.release_entry(0)
    plan.release_entry(0)  # idempotent
    plan.release_entry(1)  # raw: nothing to do
    assert pool.stats()["active_buffers"] == 1
    plan.release_all()
    plan.release_all()
    s = pool.stats()
    assert (s["active_bytes"], s["active_buffers"], s["cached_buffers"]) == (0, 0, 2)


def test_codec_released_as_soon_as_compression_ends() -> None:
    provider, pool = TensorCodecProvider(ZSTD), TensorBufferPool(1 << 20)
    with plan_compression([zeros(5000), zeros(6000)], ZSTD, provider, pool) as plan:
        assert [e.codec_id for e in plan.entries] == [CODEC_ZSTD, CODEC_ZSTD]
        s = provider.stats()
        assert (s["in_use"], s["idle"], s["encoder_acquired"]) == (0, 1, 1)  # one per plan
        assert pool.stats()["active_buffers"] == 2
    assert pool.stats()["active_buffers"] == 0


def test_codec_busy_keeps_eligible_tensors_raw() -> None:
    provider, pool = TensorCodecProvider(ZSTD), TensorBufferPool(1 << 20)
    held = provider.acquire_decoder(timeout=1)  # the only context
    plan = plan_compression([zeros(5000), zeros(10)], ZSTD, provider, pool)
    assert [e.reason for e in plan.entries] == ["codec_busy", "below_min_bytes"]
    provider.release(held)
    assert pool.stats()["misses"] == 0


def test_no_codec_acquired_without_eligible_tensors() -> None:
    provider, pool = TensorCodecProvider(ZSTD), TensorBufferPool(1 << 20)
    plan_compression([zeros(10), torch.ones(5, device="meta")], ZSTD, provider, pool)
    assert provider.stats()["created"] == 0


def test_no_buffer_within_budget() -> None:
    provider, pool = TensorCodecProvider(LZ4), TensorBufferPool(10_000)
    plan = plan_compression([zeros(1000), zeros(2000)], LZ4, provider, pool)
    # 8000 raw bytes need an 8047-byte buffer: fits; the second needs 16078: does not.
    assert [e.reason for e in plan.entries] == ["", "no_buffer"]
    assert pool.stats()["rejections"] == 1
    plan.release_all()


def test_size_the_codec_cannot_take_stays_raw() -> None:
    cfg = TensorCompressionConfig(codec=Lz4CodecConfig(), min_bytes=0, excluded_dtypes=())
    provider, pool = TensorCodecProvider(cfg), TensorBufferPool(1 << 20)
    huge = torch.empty(LZ4_MAX_INPUT_SIZE + 1, dtype=torch.uint8)  # reserved, never touched
    plan = plan_compression([huge, zeros(1000)], cfg, provider, pool)
    assert [e.reason for e in plan.entries] == ["unsupported_size", ""]
    assert plan.entries[0].payload is huge
    plan.release_all()


def test_argument_errors_return_leases_and_codec() -> None:
    provider, pool = TensorCodecProvider(ZSTD), TensorBufferPool(1 << 20)
    with pytest.raises(TypeError, match=r"tensors\[1\] must be a torch.Tensor, got list"):
        plan_compression([zeros(5000), [1, 2]], ZSTD, provider, pool)  # type: ignore[list-item]
    bad = torch.zeros(100, 100, dtype=torch.int64).t()
    with pytest.raises(ValueError, match=r"tensors\[1\].*contiguous"):
        plan_compression([zeros(5000), bad], ZSTD, provider, pool)
    assert pool.stats()["active_bytes"] == 0
    assert provider.stats()["in_use"] == 0
    # a non-contiguous tensor that is not eligible is just sent raw
    small_t = torch.zeros(4, 4).t()
    assert plan_compression([small_t], ZSTD, provider, pool).entries[0].reason == "below_min_bytes"


def test_provider_must_match_config() -> None:
    provider, pool = TensorCodecProvider(Lz4CodecConfig()), TensorBufferPool(1 << 20)
    with pytest.raises(ValueError, match="does not match"):
        plan_compression([zeros(5000)], ZSTD, provider, pool)


def test_decompress_into_tensor_raw_and_errors() -> None:
    provider = TensorCodecProvider(ZSTD)
    src = torch.arange(10, dtype=torch.int16)
    out = torch.empty_like(src)
    decompress_into_tensor(CODEC_RAW, src.view(torch.uint8), out, provider, timeout=1)
    assert torch.equal(out, src)
    decompress_into_tensor(
        CODEC_RAW, torch.empty(0, dtype=torch.uint8), torch.empty(0), provider, timeout=1
    )
    with pytest.raises(CompressionError, match="raw payload holds 20 bytes, the target holds 40"):
        decompress_into_tensor(
            CODEC_RAW, src.view(torch.uint8), torch.empty(10), provider, timeout=1
        )
    with pytest.raises(CompressionError, match=r"payload uses lz4 \(codec id 1\).*zstd"):
        decompress_into_tensor(CODEC_LZ4, src.view(torch.uint8), out, provider, timeout=1)
    with pytest.raises(CompressionError, match="unknown codec id 9"):
        decompress_into_tensor(9, src.view(torch.uint8), out, provider, timeout=1)
    with pytest.raises(CompressionError):
        decompress_into_tensor(CODEC_ZSTD, src.view(torch.uint8), out, provider, timeout=1)
    assert provider.stats()["in_use"] == 0  # released after the failure
    with pytest.raises(ValueError, match=r"src must be a torch\.uint8 tensor"):
        decompress_into_tensor(CODEC_ZSTD, src, out, provider, timeout=1)


def test_decompress_waits_for_decoder_with_timeout() -> None:
    provider, pool = TensorCodecProvider(ZSTD), TensorBufferPool(1 << 20)
    t = zeros(5000)
    plan = plan_compression([t], ZSTD, provider, pool)
    entry = plan.entries[0]
    held = provider.acquire_encoder()
    out = torch.empty_like(t)
    with pytest.raises(CompressionTimeoutError):
        decompress_into_tensor(entry.codec_id, entry.payload, out, provider, timeout=0.05)
    assert held is not None
    provider.release(held)
    decompress_into_tensor(entry.codec_id, entry.payload, out, provider, timeout=5)
    assert torch.equal(out, t)
    assert provider.stats()["in_use"] == 0
    plan.release_all()


def test_pooled_buffer_reused_by_next_plan() -> None:
    provider, pool = TensorCodecProvider(LZ4), TensorBufferPool(1 << 20)
    t = zeros(4096)
    with plan_compression([t], LZ4, provider, pool) as plan:
        ptr = plan.entries[0].payload.data_ptr()
    with plan_compression([t], LZ4, provider, pool) as plan:
        assert plan.entries[0].payload.data_ptr() == ptr
    s = pool.stats()
    assert (s["hits"], s["misses"]) == (1, 1)
