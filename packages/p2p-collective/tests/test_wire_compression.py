"""Tensor compression on the wire, between two real processes over real gloo and codecs."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
import wire_tasks as wt
from conftest import PeerPair
from test_collective_sendrecv import same

from p2p_collective import Collective

pytestmark = pytest.mark.timeout(300)

LZ4 = {"collective": {"tensor_compression": {"codec": "lz4"}}}
ZSTD_ALL = {
    "collective": {"tensor_compression": {"codec": "zstd", "excluded_dtypes": [], "level": 3}}
}
RAW: dict[str, Any] = {}


@pytest.mark.parametrize(
    ("cluster", "async_op"),
    [(LZ4, False), (ZSTD_ALL, True), (RAW, False)],
    ids=["lz4-sync", "zstd-all-dtypes-async", "raw"],
)
def test_every_payload_kind_round_trips_exactly(
    peers: PeerPair, gname: str, cluster: dict[str, Any], async_op: bool
) -> None:
    sent, got = peers.run(
        wt.t_send_wire_payloads,
        (gname, cluster, async_op),
        wt.t_recv_wire_payloads,
        (gname, cluster, async_op),
    )
    expected = wt.wire_payloads()
    for (name, want), have in zip(expected, got["got"], strict=True):
        assert same(want, have), name
    s, r = sent["stats"], got["stats"]
    # both sides count the same tensors and bytes
    for key in ("compressed_tensors", "raw_tensors", "tensor_raw_bytes", "tensor_wire_bytes"):
        assert s[key] == r[key], key
    assert s["raw_tensors"] == sum(s["raw_reasons"].values())
    assert r["raw_reasons"] == {}  # reasons stay with the sender
    assert s["wire_bytes"] == r["wire_bytes"]
    if cluster is RAW:
        assert s["compressed_tensors"] == 0
        assert set(s["raw_reasons"]) == {"disabled"}
        assert sent["pool"] is None
        return
    assert s["compressed_tensors"] >= 30
    assert s["tensor_wire_bytes"] < s["tensor_raw_bytes"] // 3
    assert s["wire_bytes"] < s["payload_bytes"]
    reasons = s["raw_reasons"]
    assert "inline" not in reasons  # min_bytes is the only size rule (issue 21)
    assert reasons["not_smaller"] >= 2  # random bytes
    assert reasons["below_min_bytes"] >= 3
    if cluster is LZ4:
        assert reasons["excluded_dtype"] == 3  # the float32 tensors stay raw by default
    else:
        assert "excluded_dtype" not in reasons
    for side in (sent, got):  # every buffer went back; not-smaller ones were not cached
        pool = side["pool"]["pool"]
        assert pool["active_bytes"] == 0
    assert sent["pool"]["pool"]["discards"] >= reasons["not_smaller"]
    assert sent["pool"]["codec"]["codec"] == cluster["collective"]["tensor_compression"]["codec"]


def test_compressible_tensors_shrink_on_the_wire(peers: PeerPair, gname: str) -> None:
    ids = wt.compressible(1 << 20)
    sent, got = peers.run(wt.t_send_one, (gname, LZ4, ids), wt.t_recv_some, (gname, LZ4))
    assert torch.equal(got["got"], ids)
    s = sent["stats"]
    assert s["compressed_tensors"] == 1
    assert s["tensor_raw_bytes"] == 1 << 20
    assert s["tensor_wire_bytes"] * 20 < 1 << 20
    assert got["stats"]["tensor_wire_bytes"] == s["tensor_wire_bytes"]
    assert s["wire_bytes"] < s["tensor_wire_bytes"] + 200  # header + metadata only
    assert s["codec_seconds"] > 0
    assert got["stats"]["codec_seconds"] > 0


def test_float32_stays_raw_by_default_and_an_empty_exclusion_list_lets_it_in(
    peers: PeerPair, gname: str
) -> None:
    from p2p_compress import make_synthetic_tensor

    sparse = make_synthetic_tensor("sparse_float32", 1 << 20)
    sent, got = peers.run(wt.t_send_one, (gname, LZ4, sparse), wt.t_recv_some, (gname, LZ4))
    assert torch.equal(got["got"], sparse)
    assert sent["stats"]["raw_reasons"] == {"excluded_dtype": 1}
    assert sent["pool"]["codec"] is None  # nothing eligible: no provider was created
    cluster = {"collective": {"tensor_compression": {"codec": "lz4", "excluded_dtypes": []}}}
    sent, got = peers.run(
        wt.t_send_one, (gname + "2", cluster, sparse), wt.t_recv_some, (gname + "2", cluster)
    )
    assert torch.equal(got["got"], sparse)
    assert sent["stats"]["compressed_tensors"] == 1
    assert sent["stats"]["tensor_wire_bytes"] < (1 << 20) // 2


def test_incompressible_data_goes_raw_and_its_buffer_is_discarded(
    peers: PeerPair, gname: str
) -> None:
    noise = wt.random_bytes(1 << 20)
    sent, got = peers.run(wt.t_send_one, (gname, LZ4, noise, 3), wt.t_recv_some, (gname, LZ4, 3))
    assert all(torch.equal(x, noise) for x in got["got"])
    assert sent["stats"]["raw_reasons"] == {"not_smaller": 3}
    assert sent["stats"]["tensor_wire_bytes"] == 3 << 20
    pool = sent["pool"]["pool"]
    assert pool["discards"] == 3
    assert pool["cached_bytes"] == 0  # discarded, not cached
    assert pool["active_bytes"] == 0


def test_async_sends_past_max_inflight_go_raw_without_waiting(peers: PeerPair, gname: str) -> None:
    cluster = {"collective": {"tensor_compression": {"codec": "zstd", "max_inflight": 2}}}
    n = 6
    out, got = peers.run(
        wt.t_send_while_codec_held, (gname, cluster, n), wt.t_recv_some, (gname, cluster, 2 * n)
    )
    for i, x in enumerate(got["got"]):
        assert torch.equal(x, wt.compressible(256 * 1024, seed=i))
    assert out["busy_while_held"] == {"codec_busy": n}
    assert out["held_seconds"] < 30
    assert out["stats"]["compressed_tensors"] == n  # once the codecs were free again
    assert out["codec"]["encoder_busy"] == n


def test_many_groups_sending_at_once_share_one_provider(peers: PeerPair, gname: str) -> None:
    cluster = {"collective": {"tensor_compression": {"codec": "zstd", "max_inflight": 1}}}
    spokes, per = 6, 4
    hub, ok = peers.run(
        wt.t_fan_out_async,
        (gname, cluster, spokes, per),
        wt.t_fan_in,
        (gname, cluster, spokes, per),
        timeout=240,
    )
    assert ok
    busy = sum(s["raw_reasons"].get("codec_busy", 0) for s in hub["stats"])
    compressed = sum(s["compressed_tensors"] for s in hub["stats"])
    assert busy + compressed == spokes * per
    assert hub["codec"]["codec"]["encoder_busy"] == busy  # one eligible tensor per frame
    assert hub["codec"]["codec"]["created"] == 1
    assert hub["codec"]["pool"]["active_bytes"] == 0


def test_a_pool_budget_too_small_sends_raw(peers: PeerPair, gname: str) -> None:
    ids = wt.compressible(1 << 20)
    small = {
        "collective": {
            "tensor_compression": {"codec": "lz4"},
            "tensor_buffer_pool": {"max_bytes": 64 * 1024},
        }
    }
    sent, got = peers.run(wt.t_send_one, (gname, small, ids), wt.t_recv_some, (gname, small))
    assert torch.equal(got["got"], ids)
    assert sent["stats"]["raw_reasons"] == {"no_buffer": 1}
    assert sent["pool"]["pool"]["rejections"] == 1


def test_a_receiver_without_pool_budget_still_takes_compressed_payloads(
    peers: PeerPair, gname: str
) -> None:
    from p2p_compress import make_synthetic_tensor

    # compresses about 2x: stays a payload message (more than the header message holds)
    ids = make_synthetic_tensor("int64_token_ids", 1 << 20)
    tiny = {
        "collective": {
            "tensor_compression": {"codec": "lz4"},
            "tensor_buffer_pool": {"max_bytes": 1},
        }
    }
    sent, got = peers.run(wt.t_send_one, (gname, LZ4, ids), wt.t_recv_some, (gname, tiny))
    assert torch.equal(got["got"], ids)
    assert sent["stats"]["compressed_tensors"] == 1
    assert got["pool"]["pool"]["rejections"] == 1  # received into a plain allocation


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [(LZ4, ZSTD_ALL), (LZ4, RAW)],
    ids=["lz4-vs-zstd", "lz4-vs-off"],
)
def test_mismatched_configs_fail_clearly_at_setup(
    peers: PeerPair, gname: str, mine: dict[str, Any], theirs: dict[str, Any]
) -> None:
    a, b = peers.run(wt.t_first_op, (gname, mine, "send"), wt.t_first_op, (gname, theirs, "recv"))
    for msg in (a, b):
        assert msg.startswith("CollectiveError: "), msg
        assert "different job-level wire configurations" in msg
        assert '"codec":"lz4"' in msg
        assert (
            ('"codec":"zstd"' in msg)
            if theirs is ZSTD_ALL
            else ('"tensor_compression":null' in msg)
        )


def test_pool_size_and_emulation_may_differ_between_the_ends(peers: PeerPair, gname: str) -> None:
    other = {
        "collective": {
            "tensor_compression": {"codec": "lz4"},
            "tensor_buffer_pool": {"max_bytes": 1 << 24},
        },
        "net_emulation": {"bandwidth_mbps": 10000},
    }
    ids = wt.compressible(1 << 20)
    _, got = peers.run(wt.t_send_one, (gname, LZ4, ids), wt.t_recv_some, (gname, other))
    assert torch.equal(got["got"], ids)


@pytest.mark.parametrize("index", [0, 2], ids=["decoded-while-receiving", "decoded-last"])
def test_a_corrupted_payload_fails_the_receive_and_breaks_only_that_direction(
    peers: PeerPair, gname: str, index: int
) -> None:
    back, out = peers.run(
        wt.t_send_corrupted, (gname, LZ4, index), wt.t_recv_corrupted, (gname, LZ4)
    )
    assert out[0].startswith("FramingError: ")
    assert f"compressed tensor {index} (lz4" in out[0]
    assert "does not decode" in out[0]
    assert out[1] == "cause CompressionError"
    assert out[2] == "then GroupBrokenError cause=FramingError"
    assert out[3] == "other group ok=True"
    assert out[4] == "pool active_bytes=0"
    assert back == "reply on the healthy direction"


def test_a_missing_codec_library_fails_when_the_collective_loads_its_config() -> None:
    code = (
        # Hide python-zstandard and the system libzstd, as on a machine without either.
        "import sys, ctypes.util; sys.modules['zstandard'] = None\n"
        "ctypes.util.find_library = lambda name: None\n"
        "import torch.distributed as dist, datetime\n"
        "from p2p_collective import Collective, parse_collective_config\n"
        "from p2p_compress import CompressionError\n"
        "store = dist.HashStore()\n"
        "cfg = parse_collective_config({'tensor_compression': {'codec': 'zstd'}})\n"
        "try:\n"
        "    Collective('a', store, config=cfg)\n"
        "except CompressionError as exc:\n"
        "    print('CompressionError:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.startswith("CompressionError:"), out.stdout + out.stderr
    assert "zstandard" in out.stdout


def test_the_pool_exists_from_the_start_and_the_provider_comes_at_first_use() -> None:
    import datetime

    import torch.distributed as dist

    from p2p_collective import parse_collective_config

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )
    cfg = parse_collective_config({"tensor_compression": {"codec": "zstd"}})
    coll = Collective("solo", store, config=cfg)
    stats = coll.compression_stats()
    assert stats is not None
    assert stats["codec"] is None
    assert stats["pool"]["active_bytes"] == stats["pool"]["cached_bytes"] == 0
    assert Collective("plain", store).compression_stats() is None
    coll.close()
