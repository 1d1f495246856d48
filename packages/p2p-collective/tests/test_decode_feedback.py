"""Decode rates measured by the receiver reach an adaptive sender (issue 21).

The receiver times each decode call and sends the figures back on the direction's
liveness connection; the sender's link advisor uses them instead of a constant factor.
Two real processes over shared memory (emulated, so it may compress) and gloo, real lz4.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import decode_tasks as dt
import pytest
import torch
from conftest import PeerPair

from p2p_collective._compression._adaptive import (
    SHUFFLED_DECODE_SPEEDUP,
    Choice,
    LinkAdvisor,
    Sampler,
)
from p2p_collective._compression._decode_rates import (
    RECORD,
    DecodeReporter,
    FrameDecodes,
    pack_record,
    parse_record,
)
from p2p_collective._links._liveness import BYE, RECORD_BYTES, split_records
from p2p_compress import Lz4Codec, make_synthetic_tensor

pytestmark = pytest.mark.timeout(300)

KiB = 1024
LZ4 = 1
TRANSPORTS = pytest.mark.parametrize("shm", [True, False], ids=["shm", "gloo"])


def test_a_record_round_trips_and_a_bad_one_is_refused_with_what_is_wrong() -> None:
    record = pack_record(LZ4, 2, True, 8, 41, 512 * KiB, 0.0004)
    assert len(record) == RECORD.size == RECORD_BYTES
    sample = parse_record(record)
    assert (sample.codec_id, sample.decoders, sample.shuffled) == (LZ4, 2, True)
    assert (sample.chunks, sample.seq, sample.raw, sample.seconds) == (8, 41, 512 * KiB, 0.0004)
    cases = {
        "codec id 0": pack_record(0, 1, False, 1, 1, 1 << 20, 0.001),
        "codec id 9": pack_record(9, 1, False, 1, 1, 1 << 20, 0.001),
        "0 decoder threads": pack_record(LZ4, 0, False, 1, 1, 1 << 20, 0.001),
        "nan seconds": pack_record(LZ4, 1, False, 1, 1, 1 << 20, math.nan),
        "-1.0 seconds": pack_record(LZ4, 1, False, 1, 1, 1 << 20, -1.0),
        "is 40 bytes, got 39": record[:-1],
        "runs from b'D'": b"X" + record[1:],
    }
    for says, bad in cases.items():
        with pytest.raises(ValueError, match=says):
            parse_record(bad)


def test_records_are_cut_from_a_stream_and_bytes_that_are_none_are_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = pack_record(LZ4, 1, False, 1, 1, 1 << 20, 0.001)
    b = pack_record(LZ4, 1, False, 1, 2, 1 << 20, 0.002)
    buf = bytearray(a + b[:10])
    assert split_records(buf) == [a]
    assert buf == b[:10]  # the rest waits for its bytes
    buf += b[10:] + b"xyz" + a[:-1] + b"!" + BYE
    with caplog.at_level(logging.WARNING, logger="p2p_collective"):
        assert split_records(buf) == [b]
    assert buf == bytearray()
    text = caplog.text
    assert "3 bytes that start no record were ignored (78797a)" in text
    assert "a record that does not end in b'\\n' was ignored" in text


def test_the_receiver_reports_each_codec_at_most_once_per_interval() -> None:
    sent: list[bytes] = []
    reporter = DecodeReporter(lambda r: sent.append(r) or True, decoders=2)
    frame = FrameDecodes()
    for _ in range(4):
        frame.add(LZ4, 256 * KiB, 0.0001, shuffled=True)
    frame.add(2, 32 * KiB, 0.0001)  # zstd: too few bytes to say anything
    reporter.report(7, frame)
    reporter.report(8, frame)  # at once again: within the interval, not sent
    assert [parse_record(r).seq for r in sent] == [7]
    got = parse_record(sent[0])
    assert (got.codec_id, got.decoders, got.shuffled, got.chunks) == (LZ4, 2, True, 4)
    assert got.raw == 1 << 20
    assert got.seconds == pytest.approx(0.0004)
    assert (reporter.sent, reporter.dropped) == (1, 0)
    dropping = DecodeReporter(lambda r: False, decoders=1)
    dropping.report(1, frame)
    assert (dropping.sent, dropping.dropped) == (0, 1)


def _advisor_on_10g() -> LinkAdvisor:
    """Token ids (shuffled) on an emulated 10 Gbit/s link: lz4 800 MB/s a call x2, ratio 3.9."""
    adv = LinkAdvisor((LZ4,), threads=2, probe_every=8, decoders=1)
    adv.observe_codec(LZ4, "int64:c2:s", 1 << 20, int((1 << 20) / 3.9), (1 << 20) / 800e6)
    adv.observe_link(1 << 20, 1.0, 1.25e9, transport="gloo")
    return adv


def test_a_measured_decode_rate_replaces_the_default_factor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = "int64:c2:s"
    adv = _advisor_on_10g()
    # default: decoding 0.6x compressing (480 MB/s) is slower than the link: raw
    assert adv.decide(data, True) == Choice(None)
    before = adv.as_dict()
    assert before["codecs"]["lz4"][data]["decode_source"] == "default"
    assert before["predicted_mbps"]["lz4"] == pytest.approx(
        SHUFFLED_DECODE_SPEEDUP[LZ4] * 800e6 * 8 / 1e6
    )
    assert "decode default" in before["reason"]
    # the receiver decoded frame 5 at 2 GB/s a call: lz4 now delivers 1.6 GB/s (its two
    # compressor threads), more than 1.1 x the link's 1.25 GB/s
    adv.sending(5, data)
    assert adv.observe_feedback(pack_record(LZ4, 1, True, 8, 5, 1 << 21, (1 << 21) / 2e9))
    assert adv.decide(data, True).codec == LZ4
    after = adv.as_dict()
    lz4 = after["codecs"]["lz4"][data]
    assert lz4["decode_source"] == "receiver"
    assert lz4["decode_mbps"] == pytest.approx(16_000)
    assert lz4["decode_samples"] == {"receiver": 1, "probe": 0}
    assert after["predicted_mbps"]["lz4"] == pytest.approx(2 * 800e6 * 8 / 1e6)
    assert after["reason"].startswith("lz4: the fastest way on this link"), after["reason"]
    assert "decode 16000 Mbit/s (receiver)" in after["reason"]
    assert after["decode_feedback"] == {"records": 1, "ignored": 0, "decoders": 1}
    # garbled feedback is logged and ignored: the figures and the decision stay
    with caplog.at_level(logging.WARNING, logger="p2p_collective"):
        assert not adv.observe_feedback(b"D" + bytes(39), "'peer-b'")
        assert not adv.observe_feedback(pack_record(LZ4, 1, True, 8, 99, 1 << 21, 1e-4))
        assert not adv.observe_feedback(pack_record(LZ4, 1, True, 8, 5, 1 << 21, math.inf))
    assert "decode feedback from 'peer-b' ignored: a decode record runs from" in caplog.text
    assert "frame 99 is not one of the last 256 frames sent" in caplog.text
    assert "a decode record of inf seconds" in caplog.text
    assert adv.decide(data, True).codec == LZ4
    assert adv.as_dict()["codecs"]["lz4"][data]["decode_mbps"] == pytest.approx(16_000)
    assert adv.as_dict()["decode_feedback"]["ignored"] == 3
    # the receiver's decoder threads count for a chunked frame (they decode chunks at once)
    adv.sending(6, data)
    assert adv.observe_feedback(pack_record(LZ4, 4, True, 8, 6, 1 << 21, (1 << 21) / 2e9))
    assert adv.as_dict()["decode_feedback"]["decoders"] == 4
    # a slow decoder (200 MB/s a call, blended in) turns the link raw again
    adv.sending(9, data)
    adv.observe_feedback(pack_record(LZ4, 1, True, 8, 9, 1 << 21, (1 << 21) / 200e6))
    blended = 0.7 * 16_000 + 0.3 * 1_600
    assert adv.as_dict()["codecs"]["lz4"][data]["decode_mbps"] == pytest.approx(blended)
    for seq in range(10, 20):
        adv.sending(seq, data)
        adv.observe_feedback(pack_record(LZ4, 1, True, 8, seq, 1 << 21, (1 << 21) / 200e6))
    assert adv.decide(data, True) == Choice(None)
    assert adv.reason.startswith("raw: the link is faster than the codecs"), adv.reason
    # a faster figure counts at once (wall time only ever shows a decoder slower)
    adv.observe_decode(LZ4, data, 256 * KiB, 256 * KiB / 2e9)
    assert adv.as_dict()["codecs"]["lz4"][data]["decode_mbps"] == pytest.approx(16_000)
    assert adv.as_dict()["codecs"]["lz4"][data]["decode_source"] == "probe"
    assert adv.decide(data, True).codec == LZ4


def test_a_probe_aside_measures_decoding_shuffled_as_chunks_go() -> None:
    ids = make_synthetic_tensor("int64_token_ids", 1 << 20, seed=1).view(-1).view(torch.uint8)
    sampler = Sampler()
    plain = sampler.measure(Lz4Codec(), ids)
    shuffled = sampler.measure(Lz4Codec(), ids, 8)
    for raw, _wire, compress, decode in (plain, shuffled):
        assert raw == 256 * KiB
        assert compress > 0
        assert decode > 0
    assert plain[0] / plain[1] < 2.5 < 3.5 < shuffled[0] / shuffled[1]  # as the wire shrinks
    adv = _advisor_on_10g()
    adv.observe_decode(LZ4, "int64:c2:s", shuffled[0], shuffled[3])
    lz4 = adv.as_dict()["codecs"]["lz4"]["int64:c2:s"]
    assert lz4["decode_source"] == "probe"
    assert lz4["decode_mbps"] == pytest.approx(shuffled[0] / shuffled[3] * 8 / 1e6)


def cluster(shm: bool) -> dict[str, Any]:
    return {
        "collective": {
            "tensor_compression": {"codec": "lz4", "excluded_dtypes": []},
            "compression_pipeline": {
                "chunk_bytes": 64 * KiB,
                "compressor_threads": 1,
                "adaptive": {"codecs": ["lz4"]},
            },
            "shared_memory": shm,
        },
        # slow enough that lz4 pays from the start: every frame after learning compresses
        "net_emulation": {"bandwidth_mbps": 100, "delay_ms": 0},
    }


@TRANSPORTS
def test_the_receivers_decode_rate_reaches_the_sender_and_decides(
    peers: PeerPair, gname: str, shm: bool
) -> None:
    n = 8
    sent, got = peers.run(
        dt.t_send_ids, (gname, cluster(shm), n, 0), dt.t_recv_ids, (gname, cluster(shm), n, 0)
    )
    assert got["ok"]  # bit-exact
    assert sent["arrived"], sent["stats"]["adaptive"]
    adaptive = sent["stats"]["adaptive"]
    assert adaptive["transport"] == ("shm" if shm else "gloo")
    assert adaptive["decision"] == "lz4", adaptive
    data = adaptive["dtype"]
    assert data == "int64:c2:s"
    lz4 = adaptive["codecs"]["lz4"][data]
    assert lz4["decode_source"] == "receiver"
    assert lz4["decode_mbps"] > 0
    assert lz4["decode_samples"]["receiver"] >= 1
    assert lz4["decode_samples"]["probe"] == 1  # the learning frame's own, decoded aside
    assert "(receiver)" in adaptive["reason"]
    fb = adaptive["decode_feedback"]
    assert fb["records"] >= 1
    assert fb["ignored"] == 0
    assert fb["records"] <= got["stats"]["decode_reports"]["sent"] <= n
    assert got["stats"]["decode_reports"]["dropped"] == 0
    # on a link between the two predictions, the measured figure decides: the default
    # factor would choose the other way
    assert sent["old"] != sent["new"]
    want = LZ4 if sent["new"] > sent["old"] else None
    assert sent["choice"] == want, sent
    assert sent["judged"]["predicted_mbps"]["lz4"] == pytest.approx(sent["new"], rel=1e-6)
    assert sent["lines"] == []  # nothing was logged
    assert not sent["broken"]


@TRANSPORTS
def test_garbled_feedback_is_logged_and_ignored_and_the_link_keeps_working(
    peers: PeerPair, gname: str, shm: bool
) -> None:
    n = 8
    sent, got = peers.run(
        dt.t_send_ids, (gname, cluster(shm), n, 3), dt.t_recv_ids, (gname, cluster(shm), n, 3)
    )
    assert got["ok"]  # every frame bit-exact, before and after the garbage
    assert sent["arrived"], sent["stats"]["adaptive"]
    fb = sent["stats"]["adaptive"]["decode_feedback"]
    assert fb["ignored"] == 3
    assert fb["records"] >= 1  # good records still count, after the garbage too
    lines = "\n".join(sent["lines"])
    assert "decode feedback from" in lines
    assert "a decode record names codec id 9, not a known codec" in lines
    assert "a decode record of nan seconds" in lines
    assert "frame 1000000000000 is not one of the last 256 frames sent" in lines
    assert "3 bytes that start no record were ignored (78797a)" in lines
    assert not sent["broken"]
    assert not got["stats"]["broken"]
