"""Lossless lz4/zstd compression of CPU tensors into pooled buffers.

Codecs read a contiguous CPU tensor's memory and write a preallocated ``torch.uint8``
buffer, and decode straight into the preallocated target, with no Python ``bytes`` in
between. A :class:`TensorCodecProvider` hands out codecs (one shared lz4 codec, or a
bounded LIFO stack of zstd contexts); a :class:`TensorBufferPool` bounds and reuses
buffers; :func:`plan_compression` is the sender's per-tensor decision. Configuration
is parsed from plain dicts with :func:`parse_tensor_compression` and
:func:`parse_tensor_buffer_pool`. :func:`encode_delta` / :func:`apply_delta` turn one
version of a tensor into the next with a small bit-level patch (weight sync), and
:func:`tensor_checksum` verifies the result.

Example:
    >>> import torch
    >>> from p2p_compress import compress_tensors
    >>> ids = torch.randint(0, 1000, (1 << 16,))
    >>> with compress_tensors({"ids": ids}, "lz4") as packed:
    ...     restored = packed.decompress()["ids"]
    >>> bool(torch.equal(restored, ids))
    True
"""

from p2p_compress._advice._synthetic import SYNTHETIC_KINDS, make_synthetic_tensor
from p2p_compress._api import (
    CompressedTensor,
    CompressedTensors,
    compress_tensors,
    decompress_tensors,
    default_buffer_pool,
    default_codec_provider,
)
from p2p_compress._codecs._codec import (
    TensorCodec,
)
from p2p_compress._codecs._lz4 import LZ4_MAX_INPUT_SIZE, Lz4Codec
from p2p_compress._codecs._probe import probe_codec_library
from p2p_compress._codecs._shuffle import (
    shuffle_bytes,
    unshuffle_bytes,
)
from p2p_compress._codecs._sparse import SparseCodec
from p2p_compress._codecs._zstd import ZstdCodec
from p2p_compress._config import (
    Lz4CodecConfig,
    SparseCodecConfig,
    TensorBufferPoolConfig,
    TensorCompressionConfig,
    ZstdCodecConfig,
    parse_tensor_buffer_pool,
    parse_tensor_compression,
)
from p2p_compress._delta._apply import apply_delta
from p2p_compress._delta._checksum import tensor_checksum
from p2p_compress._delta._encode import DELTA_PREFERENCES, encode_delta
from p2p_compress._delta._patch import DELTA_CODECS, DELTA_ITEMSIZES, DELTA_KINDS, DeltaPatch
from p2p_compress._errors import CompressionError, CompressionTimeoutError
from p2p_compress._plan import (
    RAW_REASONS,
    decompress_into_tensor,
    plan_compression,
)
from p2p_compress._pool import TensorBufferPool
from p2p_compress._provider import TensorCodecProvider

__version__ = "0.1.0"

__all__ = [
    # errors
    "CompressionError",
    "CompressionTimeoutError",
    # configuration
    "Lz4CodecConfig",
    "ZstdCodecConfig",
    "SparseCodecConfig",
    "TensorCompressionConfig",
    "TensorBufferPoolConfig",
    "parse_tensor_compression",
    "parse_tensor_buffer_pool",
    "probe_codec_library",
    # codecs
    "TensorCodec",
    "Lz4Codec",
    "ZstdCodec",
    "SparseCodec",
    "LZ4_MAX_INPUT_SIZE",
    # provider and pool
    "TensorCodecProvider",
    "TensorBufferPool",
    # the sender's decision and the receiver's decode
    "plan_compression",
    "RAW_REASONS",
    "decompress_into_tensor",
    "shuffle_bytes",
    "unshuffle_bytes",
    # standalone use
    "compress_tensors",
    "decompress_tensors",
    "CompressedTensors",
    "CompressedTensor",
    "default_buffer_pool",
    "default_codec_provider",
    "make_synthetic_tensor",
    "SYNTHETIC_KINDS",
    # weight deltas
    "DeltaPatch",
    "encode_delta",
    "apply_delta",
    "tensor_checksum",
    "DELTA_KINDS",
    "DELTA_CODECS",
    "DELTA_ITEMSIZES",
    "DELTA_PREFERENCES",
    "__version__",
]
