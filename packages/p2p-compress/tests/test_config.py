"""Seed 000's configuration tables, valid and invalid."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from p2p_asyncwork import ConfigError
from p2p_compress import (
    Lz4CodecConfig,
    TensorBufferPoolConfig,
    TensorCompressionConfig,
    ZstdCodecConfig,
    parse_tensor_buffer_pool,
    parse_tensor_compression,
)

PATH = "cluster.collective.tensor_compression"

SEED_LZ4 = """
cluster:
  collective:
    tensor_buffer_pool:
      max_bytes: 2147483648
    tensor_compression:
      enabled: true
      codec: lz4
      min_bytes: 16384
      excluded_dtypes: [float32]
      acceleration: 1
"""

SEED_ZSTD = """
cluster:
  collective:
    tensor_compression:
      enabled: true
      codec: zstd
      min_bytes: 16384
      excluded_dtypes: [float32]
      level: 1
      max_inflight: 4
"""


# The seed's examples as YAML loads them (checked against a real YAML loader below).
SEED_LZ4_DICT: dict[str, Any] = {
    "tensor_buffer_pool": {"max_bytes": 2147483648},
    "tensor_compression": {
        "enabled": True,
        "codec": "lz4",
        "min_bytes": 16384,
        "excluded_dtypes": ["float32"],
        "acceleration": 1,
    },
}
SEED_ZSTD_DICT: dict[str, Any] = {
    "tensor_compression": {
        "enabled": True,
        "codec": "zstd",
        "min_bytes": 16384,
        "excluded_dtypes": ["float32"],
        "level": 1,
        "max_inflight": 4,
    },
}


def test_seed_yaml_loads_to_these_dicts() -> None:
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(SEED_LZ4)["cluster"]["collective"] == SEED_LZ4_DICT
    assert yaml.safe_load(SEED_ZSTD)["cluster"]["collective"] == SEED_ZSTD_DICT


def test_seed_lz4_example() -> None:
    doc = SEED_LZ4_DICT
    cfg = parse_tensor_compression(doc["tensor_compression"], PATH)
    assert cfg == TensorCompressionConfig(
        codec=Lz4CodecConfig(acceleration=1),
        enabled=True,
        min_bytes=16384,
        excluded_dtypes=(torch.float32,),
    )
    assert cfg.codec_name == "lz4"
    assert cfg.codec_id == 1
    pool = parse_tensor_buffer_pool(doc["tensor_buffer_pool"], "cluster.collective.tbp")
    assert pool == TensorBufferPoolConfig(max_bytes=2147483648)


def test_seed_zstd_example_and_omitted_pool() -> None:
    doc = SEED_ZSTD_DICT
    cfg = parse_tensor_compression(doc["tensor_compression"], PATH)
    assert cfg is not None
    assert cfg.codec == ZstdCodecConfig(level=1, max_inflight=4)
    assert cfg.codec_name == "zstd"
    assert cfg.codec_id == 2
    # The section is omitted: a default pool exists.
    assert parse_tensor_buffer_pool(doc.get("tensor_buffer_pool")).max_bytes == 2 * 1024**3


def test_defaults_when_only_codec_given() -> None:
    lz4 = parse_tensor_compression({"codec": "lz4"})
    assert lz4 == TensorCompressionConfig(codec=Lz4CodecConfig())
    assert lz4 is not None
    assert (lz4.enabled, lz4.min_bytes, lz4.excluded_dtypes) == (True, 16384, (torch.float32,))
    assert lz4.codec == Lz4CodecConfig(acceleration=1)
    zstd = parse_tensor_compression({"codec": "zstd"})
    assert zstd is not None
    assert zstd.codec == ZstdCodecConfig(level=1, max_inflight=4)


def test_omitted_or_disabled_means_raw() -> None:
    assert parse_tensor_compression(None) is None
    assert parse_tensor_compression({"enabled": False}) is None
    assert parse_tensor_compression({"enabled": False, "codec": "zstd", "level": 5}) is None


def test_empty_excluded_dtypes_allows_all() -> None:
    cfg = parse_tensor_compression({"codec": "lz4", "excluded_dtypes": []})
    assert cfg is not None
    assert cfg.excluded_dtypes == ()


def test_dtype_spellings() -> None:
    cfg = parse_tensor_compression(
        {
            "codec": "lz4",
            "excluded_dtypes": ["bfloat16", "torch.float16", "float", "int64", "bool", "float32"],
        }
    )
    assert cfg is not None
    # "float" is float32; duplicates collapse, order kept.
    assert cfg.excluded_dtypes == (
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.int64,
        torch.bool,
    )
    assert cfg.to_dict()["excluded_dtypes"] == ["bfloat16", "float16", "float32", "int64", "bool"]


@pytest.mark.parametrize(
    "section",
    [
        {"codec": "lz4"},
        {"codec": "lz4", "acceleration": 17, "min_bytes": 0, "excluded_dtypes": []},
        {"codec": "zstd", "level": 22, "max_inflight": 1, "excluded_dtypes": ["bfloat16"]},
        {"codec": "zstd", "enabled": True, "min_bytes": 1 << 30},
    ],
)
def test_to_dict_round_trips(section: dict[str, Any]) -> None:
    cfg = parse_tensor_compression(section, PATH)
    assert cfg is not None
    plain = cfg.to_dict()
    assert json.loads(json.dumps(plain)) == plain  # plain types only
    assert parse_tensor_compression(plain, PATH) == cfg
    pool = TensorBufferPoolConfig(max_bytes=12345)
    assert parse_tensor_buffer_pool(pool.to_dict()) == pool


def test_configs_are_frozen_and_hashable() -> None:
    cfg = TensorCompressionConfig(codec=ZstdCodecConfig(level=3))
    with pytest.raises(AttributeError):
        cfg.min_bytes = 1  # type: ignore[misc]
    assert hash(cfg) == hash(TensorCompressionConfig(codec=ZstdCodecConfig(level=3)))


def _error(section: Any, path: str = PATH) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_tensor_compression(section, path)
    return info.value


@pytest.mark.parametrize(
    ("section", "key", "value_text", "allowed_text"),
    [
        ({"min_bytes": 1}, "codec", "missing", "lz4 or zstd"),
        ({"codec": "gzip"}, "codec", "'gzip'", "lz4 or zstd"),
        ({"codec": "LZ4"}, "codec", "'LZ4'", "lz4 or zstd"),
        ({"codec": None}, "codec", "None", "lz4 or zstd"),
        ({"codec": "lz4", "enabled": "yes"}, "enabled", "'yes'", "true or false"),
        ({"codec": "lz4", "enabled": 1}, "enabled", "1", "true or false"),
        ({"codec": "lz4", "min_bytes": -1}, "min_bytes", "-1", ">= 0"),
        ({"codec": "lz4", "min_bytes": "16k"}, "min_bytes", "'16k'", ">= 0"),
        ({"codec": "lz4", "min_bytes": 1.5}, "min_bytes", "1.5", ">= 0"),
        ({"codec": "lz4", "min_bytes": True}, "min_bytes", "True", ">= 0"),
        ({"codec": "lz4", "acceleration": 0}, "acceleration", "0", ">= 1"),
        ({"codec": "lz4", "acceleration": -3}, "acceleration", "-3", ">= 1"),
        ({"codec": "lz4", "acceleration": "fast"}, "acceleration", "'fast'", ">= 1"),
        ({"codec": "zstd", "level": 0}, "level", "0", "from 1 to 22"),
        ({"codec": "zstd", "level": 23}, "level", "23", "from 1 to 22"),
        ({"codec": "zstd", "level": 2.0}, "level", "2.0", "from 1 to 22"),
        ({"codec": "zstd", "max_inflight": 0}, "max_inflight", "0", ">= 1"),
        ({"codec": "zstd", "max_inflight": None}, "max_inflight", "None", ">= 1"),
        ({"codec": "lz4", "excluded_dtypes": "float32"}, "excluded_dtypes", "'float32'", "list"),
        ({"codec": "lz4", "excluded_dtypes": 5}, "excluded_dtypes", "5", "list"),
        (
            {"codec": "lz4", "excluded_dtypes": ["float33"]},
            "excluded_dtypes[0]",
            "'float33'",
            "bfloat16",
        ),
        ({"codec": "lz4", "excluded_dtypes": ["int8", 8]}, "excluded_dtypes[1]", "8", "float32"),
    ],
)
def test_invalid_values_name_path_value_and_allowed(
    section: dict[str, Any], key: str, value_text: str, allowed_text: str
) -> None:
    err = _error(section)
    assert err.path == f"{PATH}.{key}"
    message = str(err)
    assert message.startswith(f"{PATH}.{key}:")
    assert value_text in message
    assert "allowed" in message
    assert allowed_text in message
    assert isinstance(err, ValueError)


def test_lz4_rejects_max_inflight() -> None:
    err = _error({"codec": "lz4", "max_inflight": 4})
    assert err.path == f"{PATH}.max_inflight"
    msg = str(err)
    assert "zstd parameter" in msg
    assert "codec lz4 does not accept it" in msg
    assert "got 4" in msg
    assert "acceleration" in msg  # what lz4 does accept


def test_lz4_rejects_level() -> None:
    err = _error({"codec": "lz4", "level": 3})
    assert err.path == f"{PATH}.level"
    assert "zstd parameter" in str(err)


def test_zstd_rejects_acceleration() -> None:
    err = _error({"codec": "zstd", "acceleration": 2})
    assert err.path == f"{PATH}.acceleration"
    msg = str(err)
    assert "lz4 parameter" in msg
    assert "codec zstd does not accept it" in msg
    assert "level, max_inflight" in msg


def test_unknown_key_rejected() -> None:
    err = _error({"codec": "zstd", "levle": 3})
    assert err.path == f"{PATH}.levle"
    msg = str(err)
    assert "unknown key" in msg
    assert "got 3" in msg
    assert "enabled, codec, min_bytes, excluded_dtypes, level, max_inflight" in msg


def test_disabled_section_is_still_checked() -> None:
    assert _error({"enabled": False, "codec": "lz4", "bogus": 1}).path == f"{PATH}.bogus"
    assert _error({"enabled": False, "acceleration": 2}).path == f"{PATH}.acceleration"
    assert _error({"enabled": False, "min_bytes": -5}).path == f"{PATH}.min_bytes"


@pytest.mark.parametrize("section", [[1, 2], "lz4", 7])
def test_section_must_be_a_mapping(section: Any) -> None:
    err = _error(section)
    assert err.path == PATH
    assert "mapping" in str(err)


def test_non_string_key() -> None:
    assert "string keys" in str(_error({"codec": "lz4", 3: 1}))


def test_default_path_is_section_name() -> None:
    assert _error({"codec": "lz4", "x": 1}, "tensor_compression").path == "tensor_compression.x"
    with pytest.raises(ConfigError) as info:
        parse_tensor_compression({"codec": "lz4", "x": 1})
    assert info.value.path == "tensor_compression.x"


def test_buffer_pool_section() -> None:
    assert parse_tensor_buffer_pool(None) == TensorBufferPoolConfig()
    assert parse_tensor_buffer_pool({}) == TensorBufferPoolConfig(max_bytes=2 * 1024**3)
    assert parse_tensor_buffer_pool({"max_bytes": 1}).max_bytes == 1
    path = "cluster.collective.tensor_buffer_pool"
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"max_bytes": 0}, "max_bytes", "0"),
        ({"max_bytes": "2GiB"}, "max_bytes", "'2GiB'"),
        ({"max_bytes": 1.0}, "max_bytes", "1.0"),
        ({"max_byte": 5}, "max_byte", "5"),
    ]
    for section, key, value in cases:
        with pytest.raises(ConfigError) as info:
            parse_tensor_buffer_pool(section, path)
        assert info.value.path == f"{path}.{key}"
        assert value in str(info.value)
        assert "allowed" in str(info.value)
    with pytest.raises(ConfigError, match="mapping"):
        parse_tensor_buffer_pool([1], path)  # type: ignore[arg-type]


def test_constructors_validate() -> None:
    with pytest.raises(ValueError, match="acceleration"):
        Lz4CodecConfig(acceleration=0)
    with pytest.raises(ValueError, match="level"):
        ZstdCodecConfig(level=0)
    with pytest.raises(ValueError, match="max_inflight"):
        ZstdCodecConfig(max_inflight=0)
    with pytest.raises(ValueError, match="min_bytes"):
        TensorCompressionConfig(codec=Lz4CodecConfig(), min_bytes=-1)
    with pytest.raises(ValueError, match="codec"):
        TensorCompressionConfig(codec="lz4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="excluded_dtypes"):
        TensorCompressionConfig(codec=Lz4CodecConfig(), excluded_dtypes=("nope",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        TensorBufferPoolConfig(max_bytes=0)
    # dtype names are accepted programmatically too, and normalised to dtypes
    cfg = TensorCompressionConfig(
        codec=Lz4CodecConfig(),
        excluded_dtypes=("bfloat16",),  # type: ignore[arg-type]
    )
    assert cfg.excluded_dtypes == (torch.bfloat16,)


def test_a_misnamed_codec_key_is_an_unknown_key_with_a_hint() -> None:
    """{"algorithm": "lz5"} alone: the key is wrong, not the codec missing."""
    err = _error({"algorithm": "lz5"})
    assert err.path == f"{PATH}.algorithm"
    assert str(err) == (
        f"{PATH}.algorithm: unknown key; got 'lz5'; "
        "allowed: keys enabled, codec, min_bytes, excluded_dtypes; did you mean 'codec'?"
    )


@pytest.mark.parametrize(
    ("section", "key", "hint"),
    [
        ({"codec": "zstd", "levle": 3}, "levle", "level"),
        ({"codec": "lz4", "min_byte": 3}, "min_byte", "min_bytes"),
        ({"codec": "lz4", "enable": True}, "enable", "enabled"),
        ({"codec": "lz4", "excluded_dtype": []}, "excluded_dtype", "excluded_dtypes"),
        ({"codec": "lz4", "codc": "lz4"}, "codc", "codec"),
        ({"codek": "lz4"}, "codek", "codec"),
    ],
)
def test_misspelled_keys_get_did_you_mean(section: dict[str, Any], key: str, hint: str) -> None:
    err = _error(section)
    assert err.path == f"{PATH}.{key}"
    assert str(err).endswith(f"; did you mean {hint!r}?")


@pytest.mark.parametrize(
    ("section", "key", "hint"),
    [
        ({"codec": "lz5"}, "codec", "lz4"),
        ({"codec": "ZSTD"}, "codec", "zstd"),
        ({"codec": "lz4", "excluded_dtypes": ["float33"]}, "excluded_dtypes[0]", "float32"),
    ],
)
def test_misspelled_values_get_did_you_mean(section: dict[str, Any], key: str, hint: str) -> None:
    err = _error(section)
    assert err.path == f"{PATH}.{key}"
    assert str(err).endswith(f"; did you mean {hint!r}?")


def test_missing_codec_reads_like_every_other_message() -> None:
    err = _error({"min_bytes": 1})
    assert str(err) == (
        f"{PATH}.codec: got no value (the key is missing); allowed: lz4 or zstd, "
        "required when compression is enabled"
    )


def test_pool_unknown_key_has_a_hint() -> None:
    with pytest.raises(ConfigError) as info:
        parse_tensor_buffer_pool({"max_byte": 1}, "pool")
    assert str(info.value) == (
        "pool.max_byte: unknown key; got 1; allowed: keys max_bytes; did you mean 'max_bytes'?"
    )
