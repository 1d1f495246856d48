"""Parsing and validating the compression configuration with p2p-compress.

Runs on its own: ``python docs/examples/compress_config.py``. The dicts below are what a
YAML loader returns for the ``cluster.collective`` sections shown in the docs.
"""

from __future__ import annotations

import torch

from p2p_asyncwork import ConfigError
from p2p_compress import (
    Lz4CodecConfig,
    ZstdCodecConfig,
    parse_tensor_buffer_pool,
    parse_tensor_compression,
)

SECTION = "cluster.collective.tensor_compression"


def main() -> None:
    lz4 = parse_tensor_compression(
        {
            "enabled": True,
            "codec": "lz4",
            "min_bytes": 16384,
            "excluded_dtypes": ["float32"],
            "acceleration": 1,
        },
        path=SECTION,
    )
    assert lz4 is not None
    assert lz4.codec_name == "lz4"
    assert lz4.codec == Lz4CodecConfig(acceleration=1)
    assert lz4.excluded_dtypes == (torch.float32,)

    # Only `codec` is required; everything else has the documented default.
    zstd = parse_tensor_compression({"codec": "zstd"}, path=SECTION)
    assert zstd is not None
    assert zstd.codec == ZstdCodecConfig(level=1, max_inflight=4)
    assert zstd.min_bytes == 16384
    assert zstd.excluded_dtypes == (torch.float32,)
    assert parse_tensor_compression(zstd.to_dict(), path=SECTION) == zstd  # round trip

    # `excluded_dtypes: []` lets every dtype be considered, float32 included.
    every_dtype = parse_tensor_compression({"codec": "lz4", "excluded_dtypes": []})
    assert every_dtype is not None
    assert every_dtype.excluded_dtypes == ()

    # No section, or `enabled: false`: the raw wire path.
    assert parse_tensor_compression(None) is None
    assert parse_tensor_compression({"enabled": False, "codec": "lz4"}) is None

    # The buffer pool is its own section; omitted, it gets the 2 GiB default.
    assert parse_tensor_buffer_pool(None).max_bytes == 2 * 1024**3
    assert parse_tensor_buffer_pool({"max_bytes": 1 << 28}).max_bytes == 1 << 28

    # Each codec accepts only its own parameters: zstd rejects lz4's `acceleration`.
    # Bad values and unknown codecs are refused the same way; every message names the
    # key path, the value given and what is allowed.
    bad_sections = [
        {"codec": "zstd", "acceleration": 2},
        {"codec": "lz4", "acceleration": 0},
        {"codec": "brotli"},
    ]
    for bad in bad_sections:
        error = None
        try:
            parse_tensor_compression(bad, path=SECTION)
        except ConfigError as exc:  # also a ValueError
            error = exc
        assert error is not None, f"{bad} must be rejected"
        assert error.path.startswith(SECTION), error.path
        print(f"rejected: {error}")
    print("compress_config: ok")


if __name__ == "__main__":
    main()
