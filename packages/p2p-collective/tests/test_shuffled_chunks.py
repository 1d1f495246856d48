"""Byte-shuffled chunks (frame version 7): int64 token ids shrink 3.9x with lz4, bit-exact.

Two real processes over shared memory and over gloo with real lz4 and zstd. Chunks of
65537 bytes start inside elements, so the shuffle's partial-element tails are crossed.
"""

from __future__ import annotations

from typing import Any

import chunk_tasks as ck
import pytest
import torch
import wire_tasks as wt
from conftest import PeerPair
from test_collective_sendrecv import same

from p2p_collective import FramingError
from p2p_collective._compression._chunk_recv import receive_chunks
from p2p_collective._compression._chunks import pack_descriptor
from p2p_collective._frames._framing import TensorMeta
from p2p_compress import make_synthetic_tensor

pytestmark = pytest.mark.timeout(300)

KiB = 1024
TRANSPORTS = pytest.mark.parametrize("shm", [True, False], ids=["shm", "gloo"])


def cluster(codec: str, shm: bool, chunk_bytes: int) -> dict[str, Any]:
    return {
        "collective": {
            "tensor_compression": {"codec": codec, "excluded_dtypes": []},
            "compression_pipeline": {"chunk_bytes": chunk_bytes},
            "shared_memory": shm,
        }
    }


def payloads() -> list[Any]:
    ids32 = torch.randint(0, 50257, (100_003,), generator=torch.Generator().manual_seed(4))
    return [
        wt.token_ids(1024 * KiB + 8 * 3, seed=7),  # int64: shuffled
        ids32.to(torch.int32),  # int32: shuffled
        wt.compressible(5 * 64 * KiB + 2, torch.int16),
        make_synthetic_tensor("repeated", 512 * KiB, seed=2),  # runs: plain lz4 wins
        {"ids": wt.token_ids(300 * KiB, seed=8), "mask": torch.ones(200 * KiB, dtype=torch.bool)},
    ]


@TRANSPORTS
@pytest.mark.parametrize(("codec", "async_op"), [("lz4", False), ("zstd", True)])
def test_shuffled_chunks_are_bit_exact_when_chunks_start_inside_elements(
    peers: PeerPair, gname: str, shm: bool, codec: str, async_op: bool
) -> None:
    cl = cluster(codec, shm, 65537)
    sent, got = peers.run(
        ck.t_send_all, (gname, cl, payloads(), async_op), ck.t_recv_all, (gname, cl, 5)
    )
    for i, (want, have) in enumerate(zip(payloads(), got["got"], strict=True)):
        assert same(want, have), i
    assert sent["stats"]["compressed_chunks"] == got["stats"]["compressed_chunks"] > 20
    for side in (sent, got):
        assert side["pool"]["pool"]["active_bytes"] == 0


@TRANSPORTS
def test_lz4_sends_int64_token_ids_in_a_quarter_of_their_bytes(
    peers: PeerPair, gname: str, shm: bool
) -> None:
    ids = wt.token_ids(2048 * KiB, seed=5)
    cl = cluster("lz4", shm, 256 * KiB)
    sent, got = peers.run(ck.t_send_all, (gname, cl, [ids], False), ck.t_recv_all, (gname, cl, 1))
    assert torch.equal(got["got"][0], ids)
    s = sent["stats"]
    assert s["compressed_chunks"] == 8
    assert s["tensor_raw_bytes"] / s["tensor_wire_bytes"] > 3.5  # plain lz4: 1.98


def _feed(messages: list[bytes]) -> Any:
    queue = list(messages)

    def recv(t: torch.Tensor, deadline: float | None) -> None:
        data = queue.pop(0)
        t[: len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    return recv


@pytest.mark.parametrize(
    ("dtype", "descriptor", "says"),
    [
        (torch.int64, pack_descriptor(0, 96, 96, 0, 0, True), "says it is shuffled, but it is raw"),
        (
            torch.uint8,
            pack_descriptor(1, 96, 50, 0, 0, True),
            "shuffled, but it is lz4 of 1-byte elements",
        ),
    ],
    ids=["raw", "bytes"],
)
def test_a_shuffle_bit_where_none_can_be_is_a_framing_error(
    dtype: torch.dtype, descriptor: bytes, says: str
) -> None:
    n = 96 // dtype.itemsize
    meta = TensorMeta(dtype, (n,), 0, 0, 0, 96, 96)
    target = torch.zeros(n, dtype=dtype)
    with pytest.raises(FramingError, match=says):
        receive_chunks(_feed([descriptor]), [meta], [target], None, None, "b", None, None)
