"""Groups of two members on one node: ``p2p_worker.compat`` collectives over shared memory.

Every collective of such a group travels through the group's own shared-memory pair
(never through the pair of its ``send``/``recv``), gives gloo's results for every
reduction, size (inline messages, one slot, more than the ring) and dtype, refuses bad
shapes before anything moves, and fails with ``PeerError`` within seconds when the other
member dies.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from plain_ray import fresh_members, plain_local_ray

import p2p_worker.compat as col
from p2p_collective import PeerError

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

CALL_TIMEOUT = 90.0
DEATH_BOUND = 5.0
SIZES = [3, 40_000, 300_000, 2_500_000]  # float32 items: inline, sync, one slot, > ring


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    """A plain embedded Ray on loopback for this module (``ray.init``, no p2p Cluster)."""
    with plain_local_ray(sys.modules[__name__]):
        yield


@pytest.fixture
def two(ray_up: None) -> Iterator[list[Any]]:
    """Two fresh member actors, killed afterwards."""
    with fresh_members(2) as team:
        yield team


def on(team: list[Any], fn: Any, *args: Any) -> list[Any]:
    return ray.get(  # type: ignore[no-any-return]
        [m.run.remote(fn, rank, *args) for rank, m in enumerate(team)], timeout=CALL_TIMEOUT
    )


def _every_op(rank: int, sizes: list[int]) -> list[Any]:
    col.init_collective_group(2, rank, "gloo", "pair-ops")
    handle = col.get_group_handle("pair-ops")
    before = handle.collectives_transport
    out: list[Any] = []
    for n in sizes:
        base = torch.arange(n, dtype=torch.float32) % 7
        for op in (col.ReduceOp.SUM, col.ReduceOp.PRODUCT, col.ReduceOp.MIN, col.ReduceOp.MAX):
            t = base + rank + 1
            col.allreduce(t, "pair-ops", op=op)
            a, b = base + 1, base + 2
            want = {"SUM": a + b, "PRODUCT": a * b, "MIN": a, "MAX": b}[op.name]
            out.append(("allreduce", n, op.name, bool(torch.equal(t, want))))
        b = base + 10 if rank == 1 else torch.zeros(n)
        col.broadcast(b, 1, "pair-ops")
        out.append(("broadcast", n, bool(torch.equal(b, base + 10))))
        r = base + rank + 1
        col.reduce(r, 0, "pair-ops")
        want_r = 2 * base + 3 if rank == 0 else base + 2
        out.append(("reduce", n, bool(torch.equal(r, want_r))))
        gathered = [torch.empty(n) for _ in range(2)]
        col.allgather(gathered, base * (rank + 1), "pair-ops")
        out.append(
            ("allgather", n, [bool(torch.equal(g, base * (i + 1))) for i, g in enumerate(gathered)])
        )
        items = [base + 10 * i + rank for i in range(2)]
        kept = [x.clone() for x in items]
        mine = torch.empty(n)
        col.reducescatter(mine, items, "pair-ops")
        ok = torch.equal(mine, 2 * base + 20 * rank + 1)
        out.append(
            (
                "reducescatter",
                n,
                bool(ok),
                all(torch.equal(x, k) for x, k in zip(items, kept, strict=True)),
            )
        )
    col.barrier("pair-ops")
    after = handle.collectives_transport
    col.destroy_collective_group("pair-ops")
    return [before, after, out]


def test_every_collective_over_shared_memory_gives_gloo_results(two: list[Any]) -> None:
    for before, after, results in on(two, _every_op, SIZES):
        assert (before, after) == (None, "shm")
        for row in results:
            flags = [x for x in row if isinstance(x, (bool, list))]
            assert all(all(f) if isinstance(f, list) else f for f in flags), row


def _dtypes(rank: int) -> list[Any]:
    col.init_collective_group(2, rank, "gloo", "pair-dtypes")
    out = []
    for dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
    ):
        t = torch.full((5,), rank + 1, dtype=dtype)
        col.allreduce(t, "pair-dtypes")
        out.append((str(dtype), t.float().tolist()))
    try:
        col.allreduce(torch.ones(2, dtype=torch.bool), "pair-dtypes")
        refused = "no error"
    except Exception as exc:
        refused = type(exc).__name__ + (" ValueError" if isinstance(exc, ValueError) else "")
    try:
        col.allgather([torch.zeros(3), torch.zeros(2)], torch.ones(2), "pair-dtypes")
        shape = "no error"
    except Exception as exc:
        shape = type(exc).__name__ + (" ValueError" if isinstance(exc, ValueError) else "")
    t = torch.full((2,), float(rank))
    col.allreduce(t, "pair-dtypes")  # still usable
    col.destroy_collective_group("pair-dtypes")
    return [out, refused, shape, t.tolist()]


def test_dtypes_and_bad_arguments_leave_the_group_usable(two: list[Any]) -> None:
    for out, refused, shape, after in on(two, _dtypes):
        assert all(values == [3.0] * 5 for _, values in out), out
        assert refused == "CollectiveArgumentError ValueError"
        assert shape == "CollectiveArgumentError ValueError"
        assert after == [1.0, 1.0]


def _send_then_collective(rank: int) -> list[float]:
    # rank 0's send is not received before both allreduce: the collective's messages
    # travel on the group's own pair and never meet the pending tensor
    col.init_collective_group(2, rank, "gloo", "pair-mix")
    warm = torch.zeros(1)  # the send/recv pair connects at its first use, on both sides
    if rank == 0:
        col.send(warm, 1, "pair-mix")
    else:
        col.recv(warm, 0, "pair-mix")
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        col.send(torch.full((4,), 42.0), 1, "pair-mix")
        col.allreduce(t, "pair-mix")
        got = t.tolist()
    else:
        col.allreduce(t, "pair-mix")
        buf = torch.zeros(4)
        col.recv(buf, 0, "pair-mix")
        got = t.tolist() + buf.tolist()
    col.destroy_collective_group("pair-mix")
    return got


def test_sends_and_collectives_never_mix(two: list[Any]) -> None:
    assert on(two, _send_then_collective) == [[3.0] * 4, [3.0] * 4 + [42.0] * 4]


def _join(rank: int) -> str | None:
    col.init_collective_group(2, rank, "gloo", "pair-doomed")
    col.allreduce(torch.ones(1), "pair-doomed", timeout=60)
    return col.get_group_handle("pair-doomed").collectives_transport


def _wait_for_death(rank: int) -> tuple[str, bool, float]:
    try:
        col.allreduce(torch.ones(1 << 20), "pair-doomed", timeout=60)
    except Exception as exc:
        return type(exc).__name__, isinstance(exc, PeerError), time.time()
    return "no error", False, time.time()


def test_a_killed_member_fails_the_pending_collective_within_seconds(two: list[Any]) -> None:
    assert on(two, _join) == ["shm", "shm"]
    pending = two[0].run.remote(_wait_for_death, 0)
    time.sleep(1.0)  # waiting in the allreduce for the other member
    killed_at = time.time()
    ray.kill(two[1])
    name, is_peer_error, failed_at = ray.get(pending, timeout=60)
    print(f"DEATH-TIME {failed_at - killed_at:.2f} s")
    assert (name, is_peer_error) == ("PeerError", True)
    assert failed_at - killed_at < DEATH_BOUND
