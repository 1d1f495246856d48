"""What p2p-collective and p2p-worker build on, apart from the user-facing names.

The names here are the wire format's codec ids, the pool's lease, the sender's per-tensor
plan and its wire entries, byte-shuffle support and the size parser
of the command-line tools. They are stable within one release of the p2p stack
(the packages are released together) but are not part of the user-facing API that
``p2p_compress.__all__`` lists, and may change between releases.
"""

from p2p_compress._advice._sizes import SIZE_RULE, parse_size
from p2p_compress._codecs._codec import (
    CODEC_LZ4,
    CODEC_NAMES,
    CODEC_RAW,
    CODEC_SPARSE,
    CODEC_ZSTD,
)
from p2p_compress._codecs._shuffle import SHUFFLE_ITEMSIZES, shuffle_itemsize
from p2p_compress._plan import CompressionPlan, WireEntry
from p2p_compress._pool import BufferLease

__all__ = [
    "CODEC_RAW",
    "CODEC_LZ4",
    "CODEC_ZSTD",
    "CODEC_SPARSE",
    "CODEC_NAMES",
    "BufferLease",
    "CompressionPlan",
    "WireEntry",
    "SHUFFLE_ITEMSIZES",
    "shuffle_itemsize",
    "parse_size",
    "SIZE_RULE",
]
