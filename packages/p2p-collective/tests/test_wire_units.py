"""In-process checks of the compression-on-the-wire pieces (no peer process needed)."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch
import torch.distributed as dist
import wire_tasks as wt

from p2p_collective import CollectiveError, CollectiveTimeoutError, FramingError
from p2p_collective._compression import (
    Outgoing,
    WireCodec,
    WireStats,
    check_entries,
    check_peer_wire_config,
    compress_frame,
    transmit,
    wire_fingerprint,
)
from p2p_collective._compression._jobs import Job
from p2p_collective._frames._framing import FIXED, parse_fixed, parse_meta
from p2p_collective._frames._payload import encode
from p2p_compress import TensorBufferPoolConfig, parse_tensor_compression

KiB = 1024


def codec(section: dict[str, object], pool: int = 1 << 26) -> WireCodec:
    cfg = parse_tensor_compression(section)
    assert cfg is not None
    return WireCodec(cfg, TensorBufferPoolConfig(pool))


def test_a_compressed_frame_parses_back_to_its_patched_metadata() -> None:
    wire = codec({"codec": "zstd"})
    payload = {
        "ids": wt.compressible(256 * KiB),
        "noise": wt.random_bytes(128 * KiB),
        "f32": torch.zeros(64 * KiB),  # float32: excluded by default
        "tiny": torch.ones(3, dtype=torch.int64),
    }
    packed = compress_frame(wire, encode(payload))
    assert packed.reasons == ["", "not_smaller", "excluded_dtype", "below_min_bytes"]
    frame = packed.frame
    hdr = parse_fixed(frame.view, 0, "test")
    metas, names = parse_meta(frame.view[FIXED.size : FIXED.size + hdr.meta_len], hdr, "test")
    assert metas == frame.metas
    assert names == list(payload)
    assert metas[0].codec_id == 2
    assert 0 < metas[0].wire_bytes < metas[0].raw_bytes
    assert [m.codec_id for m in metas[1:]] == [0, 0, 0]
    assert hdr.wire_total == sum(m.wire_bytes for m in metas)
    assert frame.payloads[0].numel() == metas[0].wire_bytes
    sent: list[int] = []
    stats = WireStats()
    transmit(lambda t, d, h: sent.append(t.numel()), packed, None, stats, None)
    assert sent[1:] == [m.wire_bytes for m in metas]
    assert wire.pool.stats()["active_bytes"] == 0  # every lease went back
    st = stats.as_dict()
    assert st["compressed_tensors"] == 1
    assert st["raw_reasons"] == {"not_smaller": 1, "excluded_dtype": 1, "below_min_bytes": 1}
    wire.close()


def test_a_frame_dropped_unsent_gives_its_buffers_back() -> None:
    wire = codec({"codec": "lz4"})
    out = Outgoing.prepare(wire, encode(wt.token_ids(512 * KiB)), async_op=True)
    assert out.resolve(None).plan is not None
    assert wire.pool.stats()["active_bytes"] > 0
    del out  # its direction broke or closed before sending it
    # The compressor thread may still hold the frame for a moment after handing it over,
    # and a cycle needs the collector: wait (bounded) for the last reference to go.
    deadline = time.monotonic() + 5.0
    while wire.pool.stats()["active_bytes"] and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert wire.pool.stats()["active_bytes"] == 0
    wire.close()


def test_entries_naming_an_unknown_codec_or_an_impossible_size_are_refused() -> None:
    wire = codec({"codec": "lz4"})
    metas = compress_frame(wire, encode(wt.compressible(256 * KiB))).frame.metas
    assert check_entries(metas, wire, "peer")
    with pytest.raises(FramingError, match="compressed with lz4 but this side has compression off"):
        check_entries(metas, None, "peer")
    # a side configured for zstd decodes lz4 too (an adaptive sender picks per link)
    assert check_entries(metas, codec({"codec": "zstd"}), "peer")
    with pytest.raises(FramingError, match="unknown codec id 9 but this side decodes only lz4"):
        check_entries([metas[0]._replace(codec_id=9)], wire, "peer")
    bad = [metas[0]._replace(wire_bytes=metas[0].raw_bytes)]
    with pytest.raises(FramingError, match="wire bytes"):
        check_entries(bad, wire, "peer")
    assert not check_entries([metas[0]._replace(codec_id=0, wire_bytes=1)], None, "peer")


def test_the_fingerprint_covers_the_frame_version_and_the_compression_section_only() -> None:
    a = parse_tensor_compression({"codec": "zstd", "excluded_dtypes": ["int64", "float32"]})
    b = parse_tensor_compression({"codec": "zstd", "excluded_dtypes": ["float32", "int64"]})
    c = parse_tensor_compression({"codec": "zstd", "level": 3})
    assert wire_fingerprint(a) == wire_fingerprint(b)
    assert wire_fingerprint(a) != wire_fingerprint(c)
    assert wire_fingerprint(None) == '{"frame_version":8,"tensor_compression":null}'


@pytest.mark.parametrize(
    ("theirs", "says"),
    [
        ('{"frame_version":7,"tensor_compression":null}', "frame version 8 here, 7 at 'b'"),
        ('{"frame_version":6,"tensor_compression":null}', "frame version 8 here, 6 at 'b'"),
        ('{"frame_version":4,"tensor_compression":null}', "frame version 8 here, 4 at 'b'"),
        ('{"frame_version":3,"tensor_compression":null}', "frame version 8 here, 3 at 'b'"),
        ('{"tensor_compression":null}', "frame version 8 here, older than 4 at 'b'"),
    ],
    ids=[
        "v7-before-decode-records",
        "v6-before-shuffled-chunks",
        "v4-before-chunked-frames",
        "v3",
        "before-versions",
    ],
)
def test_a_peer_on_another_wire_protocol_is_named_at_setup(theirs: str, says: str) -> None:
    store = dist.HashStore()
    store.set("p/send/wire", theirs.encode())
    mine = wire_fingerprint(None)
    with pytest.raises(CollectiveError, match="different p2p-collective wire protocols") as err:
        check_peer_wire_config(store, "p", "send", mine, "a", "b")
    assert says in str(err.value)
    assert "same p2p-collective version" in str(err.value)
    store.set("p/send/wire", mine.encode())
    check_peer_wire_config(store, "p", "send", mine, "a", "b")  # same protocol: fine


def test_a_job_runs_once_wherever_it_is_started() -> None:
    calls: list[str] = []
    job = Job(lambda: calls.append(threading.current_thread().name) or 7)
    assert job.result(None) == 7  # nobody started it: run here
    job.run()  # a worker arriving late does nothing
    assert calls == [threading.current_thread().name]
    cancelled: Job[int] = Job(lambda: 1)
    assert cancelled.cancel()
    cancelled.run()
    assert not cancelled.cancel()  # only once
    gate = threading.Event()
    slow: Job[int] = Job(lambda: gate.wait(5) and 3)
    worker = threading.Thread(target=slow.run)
    worker.start()
    with pytest.raises(CollectiveTimeoutError):
        slow.result(time.monotonic() + 0.05)  # a worker holds it past the deadline
    gate.set()
    worker.join()
    assert slow.result(None) == 3
    failing: Job[int] = Job(lambda: 1 // 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(None)
