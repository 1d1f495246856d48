"""``p2p-compress advise`` estimates a transfer the way p2p-collective moves it."""

from __future__ import annotations

import pytest
import torch

from p2p_compress import Lz4CodecConfig, ZstdCodecConfig, make_synthetic_tensor
from p2p_compress._advice._advise import Measurement, codec_seconds, measure, recommend, render_yaml

MiB = 1 << 20
GBIT = 1e9 / 8


def row(raw: int, wire: int, comp: float, dec: float, setting: object = None) -> Measurement:
    return Measurement(
        "t", torch.int64, (raw // 8,), setting or ZstdCodecConfig(), raw, wire, comp, dec
    )


def test_a_tensor_of_two_chunks_or_more_overlaps_codec_and_wire() -> None:
    m = row(32 * MiB, 8 * MiB, 0.08, 0.04)  # 420 MB/s, ratio 4, decoding twice as fast
    wire = 8 * MiB / GBIT
    fill = (0.08 + 0.04) / 32
    assert codec_seconds(m, GBIT) == pytest.approx(max(0.08, wire) + fill)
    assert codec_seconds(m, GBIT, chunk_bytes=0) == pytest.approx(0.08 + wire + 0.04)
    small = row(MiB, MiB // 4, 0.0025, 0.00125)  # one chunk: compress, send, decode in a row
    assert codec_seconds(small, GBIT) == pytest.approx(0.0025 + MiB / 4 / GBIT + 0.00125)


def test_chunked_frames_make_zstd_pay_at_1_gbit_where_the_serial_sum_would_not() -> None:
    # a codec about as fast as the wire: in a row it loses, overlapped it wins
    m = row(32 * MiB, 16 * MiB, 0.2, 0.1)
    raw_s = 32 * MiB / GBIT
    assert recommend([m], link_bytes_per_s=GBIT, chunk_bytes=0).config is None
    rec = recommend([m], link_bytes_per_s=GBIT)
    assert rec.config is not None
    assert rec.best_s < 0.95 * raw_s
    assert "adaptive: true" in render_yaml(rec)


def test_measured_token_ids_pay_on_slow_links_and_not_on_shared_memory() -> None:
    ids = make_synthetic_tensor("int64_token_ids", 8 * MiB, seed=1)
    rows = measure([("ids", ids)], [Lz4CodecConfig(), ZstdCodecConfig()], repeat=1)
    assert recommend(rows, link_bytes_per_s=0.1 * GBIT).config is not None
    assert recommend(rows, link_bytes_per_s=1000 * GBIT).config is None  # 1 Tbit/s


def test_tensors_sent_in_chunks_are_measured_byte_shuffled_as_the_wire_sends_them() -> None:
    ids = make_synthetic_tensor("int64_token_ids", 4 * MiB, seed=2)
    chunked = measure([("ids", ids)], [Lz4CodecConfig()], repeat=1)
    whole = measure([("ids", ids)], [Lz4CodecConfig()], repeat=1, chunk_bytes=0)
    assert chunked[0].shuffled
    assert chunked[0].label == "lz4 acceleration=1 +shuffle"
    assert chunked[0].ratio > 3.5  # lz4 after the shuffle
    assert not whole[0].shuffled
    assert 1.8 < whole[0].ratio < 2.1  # lz4 as it is
    assert chunked[0].as_dict()["shuffled"] is True
