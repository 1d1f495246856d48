"""``cluster.collective.compression_pipeline``: parsing, validation, and its effect."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from p2p_asyncwork import ConfigError
from p2p_collective import CollectiveConfig, CompressionPipelineConfig, parse_collective_config
from p2p_collective._compression import WireCodec

LZ4 = {"codec": "lz4"}


def test_defaults_round_trip_and_reach_the_codec_state() -> None:
    cfg = parse_collective_config({"tensor_compression": LZ4})
    assert cfg.compression_pipeline == CompressionPipelineConfig()
    assert cfg.compression_pipeline.to_dict() == {
        "overlap": True,
        "compressor_threads": 1,
        "decoder_threads": 1,
        "chunk_bytes": 1 << 20,
        "adaptive": False,
    }
    custom = parse_collective_config(
        {
            "tensor_compression": LZ4,
            "compression_pipeline": {
                "overlap": False,
                "compressor_threads": 2,
                "decoder_threads": 3,
                "chunk_bytes": 0,
                "adaptive": True,
            },
        }
    )
    assert parse_collective_config(custom.to_dict()) == custom
    assert pickle.loads(pickle.dumps(custom)) == custom
    assert custom.compression is not None
    wire = WireCodec(custom.compression, custom.buffer_pool, custom.compression_pipeline)
    try:
        assert wire.pipeline.overlap is False
        assert wire.pipeline.compressor_threads == 2
    finally:
        wire.close()


@pytest.mark.parametrize(
    ("section", "key", "allowed"),
    [
        ({"compressor_threads": 0}, "compressor_threads", "an integer from 1 to 64"),
        ({"compressor_threads": 65}, "compressor_threads", "an integer from 1 to 64"),
        ({"compressor_threads": True}, "compressor_threads", "an integer from 1 to 64"),
        ({"decoder_threads": 1.5}, "decoder_threads", "an integer from 1 to 64"),
        ({"overlap": "yes"}, "overlap", "true or false"),
        ({"overlapp": True}, "overlapp", "keys overlap, compressor_threads"),
    ],
)
def test_bad_values_name_the_key_the_value_and_what_is_allowed(
    section: dict[str, Any], key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_collective_config({"tensor_compression": LZ4, "compression_pipeline": section})
    path = f"cluster.collective.compression_pipeline.{key}"
    assert info.value.path == path
    assert str(info.value).startswith(path + ":")
    assert repr(next(iter(section.values()))) in str(info.value)
    assert allowed in str(info.value)


def test_not_a_mapping_and_a_wrong_type_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"compression_pipeline: got 3; allowed: a mapping"):
        parse_collective_config({"compression_pipeline": 3})
    with pytest.raises(ConfigError, match="compression_pipeline: got 'x'"):
        CollectiveConfig(compression_pipeline="x")  # type: ignore[arg-type]
