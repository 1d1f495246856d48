from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

from p2p_compress import Lz4Codec, SparseCodec, TensorCodec, ZstdCodec

# The CI gate runs hypothesis derandomized, so a red run is reproducible and a green
# one is not luck; HYPOTHESIS_PROFILE=explore draws fresh examples on every run.
settings.register_profile("gate", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))


def _lz4() -> TensorCodec:
    return Lz4Codec()


def _lz4_fast() -> TensorCodec:
    return Lz4Codec(acceleration=50)


def _zstd() -> TensorCodec:
    return ZstdCodec(level=1)


def _zstd_high() -> TensorCodec:
    return ZstdCodec(level=9)


def _zstd_stream() -> TensorCodec:
    return ZstdCodec(level=3, backend="python-zstandard")


def _zstd_planes() -> TensorCodec:
    return ZstdCodec(level=1, planes=True)


def _zstd_planes_stream() -> TensorCodec:
    return ZstdCodec(level=1, backend="python-zstandard", planes=True)


def _sparse() -> TensorCodec:
    return SparseCodec()


CODEC_FACTORIES = {
    "sparse": _sparse,
    "lz4": _lz4,
    "lz4-acc50": _lz4_fast,
    "zstd-libzstd": _zstd,
    "zstd-level9": _zstd_high,
    "zstd-stream": _zstd_stream,
    "zstd-planes": _zstd_planes,
    "zstd-planes-stream": _zstd_planes_stream,
}


@pytest.fixture(params=sorted(CODEC_FACTORIES))
def codec(request: pytest.FixtureRequest) -> TensorCodec:
    """Every codec and backend: lz4, lz4 fast, zstd (libzstd, level 9, stream fallback,
    tuned for planes on both backends), sparse."""
    return CODEC_FACTORIES[request.param]()


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes, for byte-for-byte comparison (also NaN-safe)."""
    return bytes(t.reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""


def compress(codec: TensorCodec, t: torch.Tensor) -> torch.Tensor:
    bound = codec.max_compressed_size(t.numel() * t.element_size())
    assert bound is not None
    buf = torch.empty(bound, dtype=torch.uint8)
    n = codec.compress_into(t, buf)
    assert 0 < n <= bound
    return buf[:n]
