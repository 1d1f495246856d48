"""Probing the codec libraries when configuration is loaded."""

from __future__ import annotations

import torch

from p2p_compress._codecs._codec import TensorCodec
from p2p_compress._codecs._lz4 import Lz4Codec
from p2p_compress._codecs._sparse import SparseCodec
from p2p_compress._codecs._zstd import ZstdCodec
from p2p_compress._errors import CompressionError


def probe_codec_library(name: str) -> None:
    """Import the codec's library and run a tiny round trip, so a missing one fails early.

    Call it where configuration is loaded (a worker's start); native contexts for real
    traffic are still created lazily by the provider.

    Args:
        name: ``"lz4"``, ``"zstd"`` or ``"sparse"`` (numpy only).

    Raises:
        ValueError: ``name`` is neither.
        CompressionError: the library is missing or broken; the message says what to
            install.

    Example:
        >>> probe_codec_library("zstd")
    """
    codec: TensorCodec
    if name == "lz4":
        codec = Lz4Codec()
    elif name == "zstd":
        codec = ZstdCodec()
    elif name == "sparse":
        codec = SparseCodec()
    else:
        raise ValueError(f"name must be 'lz4', 'zstd' or 'sparse', got {name!r}")
    sample = torch.arange(256, dtype=torch.int32) % 5
    bound = codec.max_compressed_size(sample.nbytes)
    assert bound is not None
    buffer = torch.empty(bound, dtype=torch.uint8)
    out = torch.empty_like(sample)
    try:
        codec.decompress_into(buffer[: codec.compress_into(sample, buffer)], out)
    except CompressionError as exc:
        raise CompressionError(f"the {name} codec library failed its self-test: {exc}") from exc
    if not torch.equal(out, sample):
        raise CompressionError(f"the {name} codec library failed its self-test: wrong output")
