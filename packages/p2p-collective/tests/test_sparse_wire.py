"""The sparse codec on the wire: an adaptive link picks it for mostly-zero float32, bit-exact.

Two real processes over shared memory and gloo; an emulated 50 Mbit/s link makes
compression pay, 64 KiB chunks keep the payloads small. Comparisons are byte for byte
(``-0.0`` is among the zeros and must come back as ``-0.0``).
"""

from __future__ import annotations

from typing import Any

import chunk_tasks as ck
import pytest
from conftest import PeerPair

pytestmark = pytest.mark.timeout(300)

KiB = 1024
TRANSPORTS = pytest.mark.parametrize("shm", [True, False], ids=["shm", "gloo"])


def cluster(shm: bool, codecs: list[str] | None = None) -> dict[str, Any]:
    adaptive: Any = True if codecs is None else {"codecs": codecs}
    return {
        "collective": {
            # the receiver's own codec is lz4: it decodes sparse all the same
            "tensor_compression": {"codec": "lz4", "excluded_dtypes": []},
            "compression_pipeline": {"chunk_bytes": 64 * KiB, "adaptive": adaptive},
            "shared_memory": shm,
        },
        "net_emulation": {"bandwidth_mbps": 50, "delay_ms": 0},
    }


@TRANSPORTS
def test_adaptive_picks_sparse_for_mostly_zero_float32(
    peers: PeerPair, gname: str, shm: bool
) -> None:
    n = 6
    cl = cluster(shm)
    sent, got = peers.run(ck.t_send_sparse, (gname, cl, n), ck.t_recv_sparse, (gname, cl, n))
    assert got == [*["ok=True"] * n, "random ok=True", "broken=False", "pool active_bytes=0"]
    st = sent["stats"]
    adaptive = st["adaptive"]
    assert adaptive["decision"] == "sparse", adaptive
    assert adaptive["reason"].startswith("sparse: the fastest way on this link"), adaptive
    data = adaptive["dtype"]
    assert data.startswith("float32:c")
    ratio = {c: adaptive["codecs"][c][data]["ratio"] for c in ("lz4", "zstd", "sparse")}
    assert ratio["sparse"] > max(5, ratio["lz4"], ratio["zstd"]), ratio
    # the first frame learned the three codecs chunk by chunk; the others went sparse
    assert st["tensor_raw_bytes"] / st["tensor_wire_bytes"] > 3, st


@TRANSPORTS
def test_a_corrupt_sparse_chunk_is_a_framing_error_and_the_group_keeps_working(
    peers: PeerPair, gname: str, shm: bool
) -> None:
    cl = cluster(shm, codecs=["sparse"])
    n = 4
    sent, got = peers.run(ck.t_send_sparse, (gname, cl, n, 9), ck.t_recv_sparse, (gname, cl, n))
    errors = [line for line in got if line.startswith("FramingError")]
    assert len(errors) == 1, got
    assert "does not decode" in errors[0]
    assert "corrupt sparse payload" in errors[0]
    assert errors[0].endswith("(cause CompressionError)")
    assert got.count("ok=True") == n - 1
    assert got[-3:] == ["random ok=True", "broken=False", "pool active_bytes=0"]
    assert sent["reply"] == "thanks"
