"""Groups of four members on one node: ``p2p_worker.compat`` collectives over a ring of
shared-memory pairs.

Every collective of such a group travels between ring neighbours through the group's
own shared-memory pairs, gives the results of a locally computed reference for every
reduction, for sizes not divisible by the number of members (small: whole tensors
gathered and reduced locally; large: ring reduce-scatter + allgather; more than one
chunk of the chains), for several dtypes and numpy arrays in place, leaves every member
with the same bits, and fails with ``PeerError`` within seconds on every other member
when one member dies.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
import torch
from plain_ray import fresh_members, plain_local_ray

import p2p_worker.compat as col
from p2p_collective import PeerError, PeerGoneError

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

N = 4
CALL_TIMEOUT = 120.0
DEATH_BOUND = 5.0
SIZES = [3, 1001, 70_001, 600_003]  # float32 items: fewer than N, small, large, > one chunk
OPS = ("SUM", "PRODUCT", "MIN", "MAX")


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    """A plain embedded Ray on loopback for this module (``ray.init``, no p2p Cluster)."""
    with plain_local_ray(sys.modules[__name__]):
        yield


@pytest.fixture
def four(ray_up: None) -> Iterator[list[Any]]:
    """Four fresh member actors, killed afterwards."""
    with fresh_members(N) as team:
        yield team


def on(team: list[Any], fn: Any, *args: Any) -> list[Any]:
    return ray.get(  # type: ignore[no-any-return]
        [m.run.remote(fn, rank, *args) for rank, m in enumerate(team)], timeout=CALL_TIMEOUT
    )


def _input(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    # small values: products of four members stay exact in every dtype used here
    return ((torch.arange(n) * (rank + 3) + rank) % 3 + 1).to(dtype)


def _reference(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    out = tensors[0].clone()
    for x in tensors[1:]:
        if op == "SUM":
            out = out + x
        elif op == "PRODUCT":
            out = out * x
        elif op == "MIN":
            out = torch.minimum(out, x)
        else:
            out = torch.maximum(out, x)
    return out


def _every_op(rank: int, sizes: list[int]) -> list[Any]:
    col.init_collective_group(N, rank, "gloo", "ring-ops")
    handle = col.get_group_handle("ring-ops")
    before = handle.collectives_transport
    out: list[Any] = []
    for n in sizes:
        everyone = [_input(r, n, torch.float32) for r in range(N)]
        for op in OPS:
            t = _input(rank, n, torch.float32)
            col.allreduce(t, "ring-ops", op=getattr(col.ReduceOp, op))
            out.append(("allreduce", n, op, bool(torch.equal(t, _reference(op, everyone)))))
            out.append(("bits", n, op, t.numpy().tobytes()))
        src = n % N
        b = everyone[src].clone() if rank == src else torch.zeros(n)
        col.broadcast(b, src, "ring-ops")
        out.append(("broadcast", n, bool(torch.equal(b, everyone[src]))))
        for op in OPS:
            dst = (n + 1) % N
            r = _input(rank, n, torch.float32)
            col.reduce(r, dst, "ring-ops", op=getattr(col.ReduceOp, op))
            want = _reference(op, everyone) if rank == dst else everyone[rank]
            out.append(("reduce", n, op, bool(torch.equal(r, want))))
        gathered = [torch.empty(n) for _ in range(N)]
        col.allgather(gathered, everyone[rank].clone(), "ring-ops")
        out.append(
            (
                "allgather",
                n,
                all(torch.equal(g, e) for g, e in zip(gathered, everyone, strict=True)),
            )
        )
        for op in OPS:
            items = [_input(rank, n, torch.float32) + i for i in range(N)]
            kept = [x.clone() for x in items]
            mine = torch.empty(n)
            col.reducescatter(mine, items, "ring-ops", op=getattr(col.ReduceOp, op))
            want = _reference(op, [_input(r, n, torch.float32) + rank for r in range(N)])
            unchanged = all(torch.equal(x, k) for x, k in zip(items, kept, strict=True))
            out.append(("reducescatter", n, op, bool(torch.equal(mine, want)), unchanged))
    col.barrier("ring-ops")
    after = handle.collectives_transport
    col.destroy_collective_group("ring-ops")
    return [before, after, out]


def test_every_collective_over_the_ring_matches_the_reference(four: list[Any]) -> None:
    results = on(four, _every_op, SIZES)
    for before, after, rows in results:
        assert (before, after) == (None, "shm")
        for row in rows:
            if row[0] != "bits":
                assert all(x for x in row if isinstance(x, bool)), row
    bits = [[row for row in rows if row[0] == "bits"] for _, _, rows in results]
    assert all(b == bits[0] for b in bits[1:])  # every member holds the same result


def _dtypes_numpy(rank: int) -> list[Any]:
    col.init_collective_group(N, rank, "gloo", "ring-dtypes")
    out = []
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int32):
        for n in (5, 40_003):  # small and large paths
            t = _input(rank, n, dtype)
            col.allreduce(t, "ring-dtypes")
            want = _reference("SUM", [_input(r, n, dtype) for r in range(N)])
            out.append((str(dtype), n, bool(torch.equal(t, want))))
    arr = np.full(70_001, rank + 1, dtype=np.int64)
    col.allreduce(arr, "ring-dtypes", op=col.ReduceOp.MAX)
    out.append(("numpy allreduce", bool((arr == N).all())))
    lst = [np.zeros(7, dtype=np.float64) for _ in range(N)]
    col.allgather(lst, np.full(7, float(rank)), "ring-dtypes")
    out.append(("numpy allgather", all((x == i).all() for i, x in enumerate(lst))))
    try:
        col.allreduce(torch.ones(2, dtype=torch.bool), "ring-dtypes")
        refused = "no error"
    except Exception as exc:
        refused = type(exc).__name__
    t = torch.full((2,), float(rank))
    col.allreduce(t, "ring-dtypes")  # still usable
    col.destroy_collective_group("ring-dtypes")
    return [out, refused, t.tolist()]


def test_dtypes_numpy_and_bad_arguments(four: list[Any]) -> None:
    for out, refused, after in on(four, _dtypes_numpy):
        assert all(row[-1] for row in out), out
        assert refused == "CollectiveArgumentError"
        assert after == [6.0, 6.0]


def _join(rank: int) -> str | None:
    col.init_collective_group(N, rank, "gloo", "ring-doomed")
    col.allreduce(torch.ones(1), "ring-doomed", timeout=60)
    return col.get_group_handle("ring-doomed").collectives_transport


def _wait_for_death(rank: int) -> tuple[str, bool, float, str]:
    try:
        col.allreduce(torch.ones(1 << 20), "ring-doomed", timeout=60)
    except Exception as exc:
        failed = type(exc).__name__, isinstance(exc, PeerError), time.time()
    else:
        return "no error", False, time.time(), ""
    try:  # a later collective of the broken group fails at once, as a PeerError too
        col.barrier("ring-doomed")
    except PeerGoneError as later:
        return (*failed, type(later).__name__)
    return (*failed, "no error")


def test_a_killed_member_fails_every_other_member_within_seconds(four: list[Any]) -> None:
    assert on(four, _join) == ["shm"] * N
    pending = [four[r].run.remote(_wait_for_death, r) for r in (0, 1, 3)]
    time.sleep(1.0)  # waiting in the allreduce for member 2
    killed_at = time.time()
    ray.kill(four[2])
    for name, is_peer_error, failed_at, later in ray.get(pending, timeout=60):
        print(f"DEATH-TIME {failed_at - killed_at:.2f} s {name}")
        assert (name, is_peer_error, later) == ("PeerError", True, "PeerGoneError")
        assert failed_at - killed_at < DEATH_BOUND
