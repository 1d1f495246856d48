"""Standalone use: compress_tensors / decompress_tensors over tensors, lists, tuples, dicts."""

from __future__ import annotations

import pytest
import torch

from p2p_compress import (
    CompressedTensors,
    Lz4CodecConfig,
    TensorBufferPool,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodecConfig,
    compress_tensors,
    decompress_tensors,
    default_buffer_pool,
    default_codec_provider,
)
from p2p_compress.internal import CODEC_LZ4, CODEC_RAW, CODEC_ZSTD


def sample() -> dict[str, torch.Tensor]:
    return {
        "ids": torch.randint(0, 1000, (5000,), generator=torch.Generator().manual_seed(0)),
        "mask": torch.arange(4096) % 100 < 60,
        "weights": torch.zeros(64, 64, dtype=torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
    }


@pytest.mark.parametrize(
    "codec", ["lz4", "zstd", Lz4CodecConfig(acceleration=4), ZstdCodecConfig(level=7)]
)
def test_dict_round_trip(codec: object) -> None:
    data = sample()
    pool = TensorBufferPool(1 << 24)
    with compress_tensors(data, codec, pool=pool) as packed:  # type: ignore[arg-type]
        assert isinstance(packed, CompressedTensors)
        assert packed.kind == "dict"
        assert packed.keys == tuple(data)
        assert len(packed) == 5
        assert packed.wire_bytes < packed.raw_bytes
        assert packed.ratio > 1
        ids = packed.items[0]
        assert ids.codec_id in (CODEC_LZ4, CODEC_ZSTD)
        assert ids.dtype == torch.int64
        assert ids.shape == (5000,)
        restored = packed.decompress(timeout=10)
    assert isinstance(restored, dict)
    assert list(restored) == list(data)
    for key, value in data.items():
        assert restored[key].dtype == value.dtype
        assert restored[key].shape == value.shape
        assert torch.equal(restored[key], value)
    assert pool.stats()["active_bytes"] == 0


def test_single_tensor_list_and_tuple() -> None:
    t = torch.zeros(1000, dtype=torch.int32)
    packed = compress_tensors(t)
    assert packed.kind == "tensor"
    assert packed.codec_name == "lz4"
    out = decompress_tensors(packed)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, t)
    packed.release()
    lst = compress_tensors([t, t + 1], "zstd")
    restored = lst.decompress()
    assert isinstance(restored, list)
    assert all(torch.equal(a, b) for a, b in zip(restored, [t, t + 1], strict=True))
    lst.release()
    tup = compress_tensors((t,), "zstd")
    assert isinstance(tup.decompress(), tuple)
    tup.release()
    assert compress_tensors([]).decompress() == []


def test_raw_entries_are_referenced_then_copied() -> None:
    noise = torch.randint(
        0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    packed = compress_tensors({"noise": noise})
    item = packed.items[0]
    assert (item.codec_id, item.reason) == (CODEC_RAW, "not_smaller")
    assert item.payload is noise
    restored = packed.decompress()
    assert isinstance(restored, dict)
    assert torch.equal(restored["noise"], noise)
    assert restored["noise"].data_ptr() != noise.data_ptr()
    packed.release()


def test_config_rules_apply() -> None:
    cfg = TensorCompressionConfig(codec=Lz4CodecConfig(), min_bytes=1024)
    packed = compress_tensors(
        [
            torch.zeros(4096),
            torch.zeros(4096, dtype=torch.int64),
            torch.zeros(10, dtype=torch.int64),
        ],
        cfg,
    )
    assert [i.reason for i in packed.items] == ["excluded_dtype", "", "below_min_bytes"]
    packed.release()


def test_out_targets() -> None:
    data = {"a": torch.arange(3000), "b": torch.ones(2000, dtype=torch.float64)}
    packed = compress_tensors(data, "zstd")
    out = {"a": torch.empty(3000, dtype=torch.int64), "b": torch.empty(2000, dtype=torch.float64)}
    result = packed.decompress(out=out)
    assert isinstance(result, dict)
    assert result["a"] is out["a"]
    assert torch.equal(out["a"], data["a"])
    assert torch.equal(out["b"], data["b"])
    with pytest.raises(ValueError, match=r"dtype torch\.float32"):
        packed.decompress(out={"a": torch.empty(3000), "b": out["b"]})
    with pytest.raises(ValueError, match="came from a dict"):
        packed.decompress(out=[out["a"], out["b"]])
    with pytest.raises(ValueError, match="holds"):
        packed.decompress(out={"a": out["a"]})
    packed.release()


def test_released_cannot_be_decompressed() -> None:
    packed = compress_tensors(torch.zeros(5000))
    packed.release()
    packed.release()
    assert packed.released
    with pytest.raises(ValueError, match="released"):
        packed.decompress()


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match="tensors must be"):
        compress_tensors(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys must be strings"):
        compress_tensors({1: torch.zeros(3)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="codec must be"):
        compress_tensors(torch.zeros(3), "gzip")
    with pytest.raises(ValueError, match="contiguous"):
        compress_tensors(torch.zeros(10, 10).t())
    with pytest.raises(ValueError, match="does not match"):
        compress_tensors(torch.zeros(3), "zstd", provider=TensorCodecProvider(Lz4CodecConfig()))
    with pytest.raises(TypeError, match="CompressedTensors"):
        decompress_tensors([torch.zeros(3)])  # type: ignore[arg-type]


def test_provider_codec_is_the_default_and_defaults_are_shared() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(level=2))
    packed = compress_tensors(torch.zeros(5000), provider=provider)
    assert packed.codec_name == "zstd"
    assert packed.provider is provider
    packed.release()
    assert default_buffer_pool() is default_buffer_pool()
    assert default_codec_provider(Lz4CodecConfig()) is default_codec_provider(
        TensorCompressionConfig(codec=Lz4CodecConfig())
    )
    assert default_codec_provider(ZstdCodecConfig(level=2)) is not provider
