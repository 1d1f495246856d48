"""The ring collectives of ``p2p_worker.compat`` for 3+ members (``_raycoll._ringpairs``).

Three spawned processes meet through a ``TCPStore``, without Ray: with shared memory on
in all of them, the ring says so after connecting and gives every member the same
reduction; with shared memory off in one member only, every member decides gloo alike
(the verdict goes round the ring). Also the size rule that keeps some allreduces on gloo.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
from typing import Any

import pytest
import torch
import torch.distributed as dist

from p2p_worker._raycoll._ringpairs import takes

pytestmark = pytest.mark.timeout(120)
N = 3


def _member(rank: int, port: int, shm: bool, key: str, out: Any, wanted: bool) -> None:
    from p2p_collective import Collective, CollectiveConfig
    from p2p_worker._raycoll._ringpairs import RingCollectives

    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
    )
    coll = Collective(
        f"{key}-{rank}", store, config=CollectiveConfig(shared_memory=shm), timeout=60
    )

    def pair(peer: int) -> Any:
        a, b = min(rank, peer), max(rank, peer)
        names = [f"{key}-{rank}", f"{key}-{peer}"]
        return coll.create_pair_group(names, group_name=f"{key}/ring/{a}-{b}")

    try:
        ring = RingCollectives(pair((rank - 1) % N), pair((rank + 1) % N), rank, N)
        on_shm = ring.connect(60, wanted=wanted)
        results = []
        if on_shm:
            for n in (5, 100_001):  # gathered and reduced locally; ring reduce-scatter
                t = torch.rand(n, generator=torch.Generator().manual_seed(rank))
                ring.allreduce(t, "sum", 60)
                results.append(t.numpy().tobytes())
            ring.barrier(60)
        out.put((rank, on_shm, results))
    except BaseException as exc:  # reported to the test, never a silent hang
        out.put((rank, repr(exc), []))
    finally:
        coll.close()


def _run(shm: tuple[bool, ...], key: str, wanted: tuple[bool, ...] = (True,) * N) -> list[Any]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_member, args=(r, store.port, shm[r], key, out, wanted[r]))
        for r in range(N)
    ]
    for p in procs:
        p.start()
    try:
        return sorted(out.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


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


def test_mid_sized_allreduce_of_eight_members_stays_on_gloo() -> None:
    assert takes("allreduce", 1 << 20, 8) is False
    assert takes("allreduce", 4096, 8)
    assert takes("allreduce", 16 << 20, 8)
    assert takes("allreduce", 1 << 20, 4)
    assert takes("allgather", 1 << 20, 8)


def test_a_large_broadcast_of_eight_members_stays_on_gloo() -> None:
    assert takes("broadcast", 16 << 20, 8) is False
    assert takes("broadcast", 1 << 20, 8)
    assert takes("broadcast", 64 << 20, 4)
    assert takes("reduce", 64 << 20, 8)
