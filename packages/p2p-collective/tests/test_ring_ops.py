"""The ring collectives of 3+ members on one node (``_groups._ring_ops``).

Three spawned processes meet through a ``TCPStore``, without Ray: with shared memory on
in all of them, the ring says so after connecting and gives every member the same
reduction; with shared memory off in one member only, every member decides gloo alike
(the verdict goes round the ring); the chains of broadcast and reduce give exact values
as one message per hop and in pieces. Also the size rule that keeps some allreduces on
gloo.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from pair_spawn import run_members

from p2p_collective._groups._ring_ops import CHAIN_CHUNK, _pieces, takes

pytestmark = pytest.mark.timeout(120)
if os.environ.get("P2P_TEST_TRANSPORT", "shm") == "gloo":
    # These members pick their transports themselves (pair_spawn): the rerun adds nothing.
    pytest.skip("P2P_TEST_TRANSPORT=gloo: the suite runs over gloo", allow_module_level=True)
N = 3
CHAIN_N = 100_003  # float32 items: one shared-memory message of 400 KB


def _ring(coll: Any, rank: int, key: str) -> Any:
    from p2p_collective.internal import RingCollectives

    def pair(peer: int) -> Any:
        a, b = min(rank, peer), max(rank, peer)
        names = [f"{key}-{rank}", f"{key}-{peer}"]
        return coll.create_pair_group(names, group_name=f"{key}/ring/{a}-{b}")

    return RingCollectives(pair((rank - 1) % N), pair((rank + 1) % N), rank, N)


def _allreduce_body(coll: Any, rank: int, key: str, wanted: bool) -> tuple[bool, list[bytes]]:
    ring = _ring(coll, rank, key)
    on_shm = ring.connect(60, wanted=wanted)
    results = []
    if on_shm:
        for n in (5, 100_001):  # gathered and reduced locally; ring reduce-scatter
            t = torch.rand(n, generator=torch.Generator().manual_seed(rank))
            ring.allreduce(t, "sum", 60)
            results.append(t.numpy().tobytes())
        ring.barrier(60)
    return on_shm, results


def _chains_body(coll: Any, rank: int, key: str) -> tuple[bool, list[bool]]:
    """Broadcast from 1 and reduce into 2: one message per hop, then in 4 KiB pieces."""
    ring = _ring(coll, rank, key)
    on_shm = ring.connect(60)
    base = torch.arange(CHAIN_N, dtype=torch.float32)
    results = []
    for chain_bytes in (ring.chain_bytes, 4096):
        ring.chain_bytes = chain_bytes  # every member alike
        t = base + 10 * rank
        ring.broadcast(t, 1, 60)
        results.append(bool(torch.equal(t, base + 10)))
        t = base + 10 * rank
        ring.reduce(t, 2, "sum", 60)
        want = 3 * base + 30 if rank == 2 else base + 10 * rank  # others: unchanged
        results.append(bool(torch.equal(t, want)))
    ring.barrier(60)
    return on_shm, results


def _run(shm: tuple[bool, ...], key: str, wanted: tuple[bool, ...] = (True,) * N) -> list[Any]:
    return run_members(_allreduce_body, key, shm, args=tuple((w,) for w in wanted))


def test_on_one_node_the_ring_runs_on_shared_memory_with_identical_bits() -> None:
    got = _run((True,) * N, "rc-on")
    assert [(r, on) for r, on, _ in got] == [(r, True) for r in range(N)]
    for i, n in enumerate((5, 100_001)):
        inputs = [torch.rand(n, generator=torch.Generator().manual_seed(r)) for r in range(N)]
        want = inputs[0] + inputs[1] + inputs[2]
        bits = {res[i] for _, _, res in got}
        assert len(bits) == 1  # every member holds the same bits
        assert torch.allclose(torch.frombuffer(bytearray(bits.pop()), dtype=torch.float32), want)


def test_shared_memory_off_in_one_member_sends_every_member_back_to_gloo() -> None:
    assert _run((True, False, True), "rc-off") == [(r, False, []) for r in range(N)]


def test_one_member_voting_against_the_ring_keeps_every_member_on_gloo() -> None:
    # What P2P_RAYCOLL_RING=0 in one member's environment does: a vote, never a deadlock.
    got = _run((True,) * N, "rc-vote", wanted=(True, True, False))
    assert got == [(r, False, []) for r in range(N)]


def test_broadcast_and_reduce_chains_give_exact_values_whole_or_in_pieces() -> None:
    got = run_members(_chains_body, "rc-chain", (True,) * N)
    assert got == [(r, True, [True] * 4) for r in range(N)]


def test_chain_pieces_cover_the_tensor_in_order() -> None:
    assert CHAIN_CHUNK == 64 << 20  # a 64 MiB broadcast or reduce is one message per hop
    assert list(_pieces(10, 4, 16)) == [(0, 4), (4, 8), (8, 10)]
    assert list(_pieces(3, 8, 4)) == [(0, 1), (1, 2), (2, 3)]  # at least one item
    assert list(_pieces((16 << 20) // 4, 4, CHAIN_CHUNK)) == [(0, (16 << 20) // 4)]


def test_mid_sized_allreduce_of_eight_members_stays_on_gloo() -> None:
    assert takes("allreduce", 1 << 20, 8) is False
    assert takes("allreduce", 4096, 8)
    assert takes("allreduce", 16 << 20, 8)
    assert takes("allreduce", 1 << 20, 4)
    assert takes("allgather", 1 << 20, 8)


def test_broadcast_and_reduce_of_any_size_run_on_the_ring() -> None:
    for members in (4, 8, 16):
        for nbytes in (4096, 1 << 20, 16 << 20, 64 << 20):
            assert takes("broadcast", nbytes, members)
            assert takes("reduce", nbytes, members)
