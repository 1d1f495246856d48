"""The sparse codec: bit-exact on signed zeros and NaNs, its ratio, and its corrupt-input errors.

The generic round trips of every dtype and shape, bounds, argument checks and fuzzing run
for it through the ``codec`` fixture and ``test_fuzz_codecs``; this file holds what is
particular to zero-word elision.
"""

from __future__ import annotations

import struct

import pytest
import torch

from p2p_compress import (
    CompressionError,
    SparseCodec,
    SparseCodecConfig,
    TensorBufferPool,
    TensorCodecProvider,
    TensorCompressionConfig,
    compress_tensors,
    decompress_into_tensor,
    make_synthetic_tensor,
    plan_compression,
    probe_codec_library,
)
from p2p_compress.internal import CODEC_NAMES, CODEC_SPARSE


def _pack(codec: SparseCodec, t: torch.Tensor) -> torch.Tensor:
    bound = codec.max_compressed_size(t.nbytes)
    assert bound is not None
    buf = torch.empty(bound, dtype=torch.uint8)
    return buf[: codec.compress_into(t, buf)]


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.reshape(-1).view(torch.uint8).tolist())


def test_signed_zeros_nans_and_infs_round_trip_bit_exact() -> None:
    x = torch.zeros(10_001)
    x[::7] = -0.0
    x[3::11] = float("nan")
    x[5::13] = float("-inf")
    x[6::17] = torch.finfo(torch.float32).tiny / 4  # subnormal
    nan_payload = torch.tensor([0x7FC00123, -0x00400001], dtype=torch.int32).view(torch.float32)
    x[100:102] = nan_payload
    codec = SparseCodec()
    out = torch.full_like(x, 7.0)
    codec.decompress_into(_pack(codec, x), out)
    assert _bits(out) == _bits(x)


@pytest.mark.parametrize("nbytes", [4, 5, 6, 7, 8, 252, 253, 255, 256, 257, 4099, 65_537])
def test_odd_sizes_keep_their_tail(nbytes: int) -> None:
    g = torch.Generator().manual_seed(nbytes)
    x = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    x[: nbytes // 2] = 0
    codec = SparseCodec()
    out = torch.empty_like(x)
    codec.decompress_into(_pack(codec, x), out)
    assert torch.equal(out, x)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16]
)
def test_mostly_zero_tensors_shrink_and_restore(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    values = torch.randn(50_000, generator=g) * 100
    x = (values * (torch.rand(50_000, generator=g) < 0.1)).to(dtype)
    codec = SparseCodec()
    payload = _pack(codec, x)
    out = torch.empty_like(x)
    codec.decompress_into(payload, out)
    assert _bits(out) == _bits(x)
    # 32-bit words: a pair of bfloat16 holding one -0.0 is a nonzero word
    assert x.nbytes / payload.numel() > (1.4 if dtype.itemsize == 2 else 2.5)


def test_ratio_on_the_benchmark_sparse_float32() -> None:
    x = make_synthetic_tensor("sparse_float32", 1 << 20)
    assert (x.view(torch.int32) == (-(2**31))).any()  # the data holds -0.0
    codec = SparseCodec()
    payload = _pack(codec, x)
    assert x.nbytes / payload.numel() > 5.5  # lz4 gets about 2.7x on the same data


def test_plan_and_provider_use_it_like_the_other_codecs() -> None:
    cfg = TensorCompressionConfig(SparseCodecConfig(), min_bytes=0, excluded_dtypes=())
    provider, pool = TensorCodecProvider(cfg), TensorBufferPool(1 << 22)
    assert provider.codec_id == CODEC_SPARSE == SparseCodecConfig.codec_id
    assert CODEC_NAMES[CODEC_SPARSE] == "sparse"
    sparse = make_synthetic_tensor("sparse_float32", 1 << 18)
    noise = make_synthetic_tensor("random_float32", 1 << 18)
    with plan_compression([sparse, noise], cfg, provider, pool) as plan:
        (a, b) = plan.entries
        assert (a.codec_id, a.reason) == (CODEC_SPARSE, "")
        assert (b.codec_id, b.reason) == (0, "not_smaller")  # no zero words: kept raw
        out = torch.empty_like(sparse)
        decompress_into_tensor(a.codec_id, a.payload, out, provider, timeout=5.0)
        assert _bits(out) == _bits(sparse)
    with compress_tensors([sparse], "sparse") as packed:
        assert packed.codec_name == "sparse"
        assert _bits(packed.decompress()[0]) == _bits(sparse)
    probe_codec_library("sparse")


def _corrupt(payload: torch.Tensor, offset: int, data: bytes) -> torch.Tensor:
    bad = payload.clone()
    bad[offset : offset + len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return bad


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda p: p[:10], "shorter than its 24-byte header"),
        (lambda p: _corrupt(p, 0, b"XXXX"), "expected magic"),
        (lambda p: _corrupt(p, 4, b"\x09"), "expected magic"),
        (lambda p: _corrupt(p, 5, b"\x05"), "describes"),
        (lambda p: _corrupt(p, 8, struct.pack("<Q", 1)), "describes"),
        (lambda p: _corrupt(p, 16, struct.pack("<Q", 10**6)), "describes"),
        (lambda p: _corrupt(p, 16, struct.pack("<Q", 3)), "header implies"),
        (lambda p: p[:-4], "header implies"),
        (lambda p: _corrupt(p, 24, b"\xff\xff\xff\xff"), "its bitmap marks"),
    ],
)
def test_corrupt_payload_is_a_compression_error_naming_the_fault(edit, match: str) -> None:  # type: ignore[no-untyped-def]
    x = make_synthetic_tensor("sparse_float32", 1 << 16)
    codec = SparseCodec()
    payload = _pack(codec, x)
    out = torch.empty_like(x)
    with pytest.raises(CompressionError, match=match):
        codec.decompress_into(edit(payload), out)
    codec.decompress_into(payload, out)  # the codec is stateless and still works
    assert _bits(out) == _bits(x)
