"""N-member groups on one node run their tensor collectives over shared memory.

Spawned members (``pair_spawn``, no Ray) create a group by address with
``create_multi_group``: two members get a pair of their own, three or four a ring of
pairs. Every routed collective gives the values computed locally here, the same bits on
every member, numpy input included; ``P2P_COLLECTIVE_RING=0`` in one member keeps every
member on gloo with the same values; bad arguments raise as before and leave the group
usable; a member that dies mid-run makes the others fail with ``PeerError`` within
seconds.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_store
from multi_tasks import after_a_death
from pair_spawn import run_members

from p2p_collective import Collective, create_multi_group, join_ranked_group
from p2p_collective._groups._multi_ops import reduce_op_name as op_name
from p2p_collective._groups._multi_shm import RING_ENV

pytestmark = pytest.mark.timeout(240)
if os.environ.get("P2P_TEST_TRANSPORT", "shm") == "gloo":
    # These members pick their transports themselves (pair_spawn): the rerun adds nothing.
    pytest.skip("P2P_TEST_TRANSPORT=gloo: the suite runs over gloo", allow_module_level=True)

BIG = 100_003  # float32 items (400 KB): the ring's reduce-scatter path, not the gather


def _small(rank: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return (torch.arange(6, dtype=torch.float64) + 1 + rank * 10).to(dtype)


def _big(rank: int) -> torch.Tensor:
    return torch.arange(BIG, dtype=torch.float32) % 5 + rank


def _names(key: str, n: int) -> list[str]:
    return [f"{key}-{r}" for r in range(n)]


def _ops_body(
    coll: Any, rank: int, key: str, n: int, kind: str, async_op: bool, ring: str | None
) -> tuple[str | None, str | None, dict[str, bytes]]:
    """Every routed collective once (small and large); results as raw bytes."""
    if ring is not None:
        os.environ[RING_ENV] = ring
    g = create_multi_group(coll, _names(key, n))
    before = g.collectives_transport

    def mk(t: torch.Tensor) -> Any:
        return t.numpy() if kind == "numpy" else t

    def done(x: Any) -> Any:
        return x.wait(timeout=60) if async_op else x

    def raw(x: Any) -> bytes:
        return bytes(np.ascontiguousarray(np.asarray(x)).tobytes())

    out: dict[str, bytes] = {}
    for op in ("sum", "product", "min", "max"):
        x = mk(_small(rank))
        assert done(g.allreduce(x, op=op, async_op=async_op, timeout=60)) is x
        out[f"allreduce_{op}"] = raw(x)
    x = mk(_small(rank, torch.int64))
    done(g.allreduce(x, op=torch.distributed.ReduceOp.SUM, async_op=async_op, timeout=60))
    out["allreduce_int64"] = raw(x)
    x = mk(_big(rank))
    done(g.allreduce(x, async_op=async_op, timeout=60))
    out["allreduce_big"] = raw(x)
    x = mk(_small(rank))
    done(g.reduce(x, dst=n - 1, op="max", async_op=async_op, timeout=60))
    out["reduce"] = raw(x)
    x = mk(_big(rank))
    done(g.reduce(x, dst=0, async_op=async_op, timeout=60))
    out["reduce_big"] = raw(x)
    got = done(g.allgather(mk(_small(rank)), async_op=async_op, timeout=60))
    assert all(isinstance(v, np.ndarray if kind == "numpy" else torch.Tensor) for v in got)
    out["allgather"] = b"".join(raw(v) for v in got)
    into = [mk(_big(rank) * 0) for _ in range(n)]
    assert done(g.allgather(mk(_big(rank)), into, async_op=async_op, timeout=60)) is into
    out["allgather_big"] = b"".join(raw(v) for v in into)
    for name, make in (("reduce_scatter", _small), ("reduce_scatter_big", _big)):
        res = mk(make(rank) * 0)
        ins = [mk(make(rank) * (i + 1)) for i in range(n)]
        assert done(g.reduce_scatter(res, ins, async_op=async_op, timeout=60)) is res
        out[name] = raw(res)
    for name, make in (("broadcast", _small), ("broadcast_big", _big)):
        x = mk(make(rank))
        assert done(g.broadcast_tensor(x, src=1, async_op=async_op, timeout=60)) is x
        out[name] = raw(x)
    assert done(g.barrier(async_op=async_op, timeout=60)) is None
    return before, g.collectives_transport, out


def _expected(rank: int, n: int) -> dict[str, bytes]:
    """What each collective gives member ``rank``, computed here in numpy."""
    small = [_small(r).numpy() for r in range(n)]
    big = [_big(r).numpy() for r in range(n)]

    def raw(x: Any) -> bytes:
        return bytes(np.ascontiguousarray(x).tobytes())

    return {
        "allreduce_sum": raw(np.sum(small, axis=0)),
        "allreduce_product": raw(np.prod(small, axis=0)),
        "allreduce_min": raw(np.min(small, axis=0)),
        "allreduce_max": raw(np.max(small, axis=0)),
        "allreduce_int64": raw(np.sum(small, axis=0).astype(np.int64)),
        "allreduce_big": raw(np.sum(big, axis=0)),
        "reduce": raw(np.max(small, axis=0) if rank == n - 1 else small[rank]),
        "reduce_big": raw(np.sum(big, axis=0) if rank == 0 else big[rank]),
        "allgather": b"".join(raw(v) for v in small),
        "allgather_big": b"".join(raw(v) for v in big),
        "reduce_scatter": raw(np.sum(small, axis=0) * (rank + 1)),
        "reduce_scatter_big": raw(np.sum(big, axis=0) * np.float32(rank + 1)),
        "broadcast": raw(small[1]),
        "broadcast_big": raw(big[1]),
    }


def _check(got: list[Any], n: int, transport: str) -> None:
    assert [g[0] for g in got] == list(range(n)), got
    for rank, before, after, out in got:
        assert (before, after) == (None, transport), (rank, before, after, out)
        want = _expected(rank, n)
        assert set(out) == set(want)
        for name, value in want.items():
            assert out[name] == value, (rank, name)


@pytest.mark.parametrize(("n", "kind", "async_op"), [(2, "torch", False), (3, "numpy", True)])
def test_every_routed_collective_runs_on_shared_memory_with_local_values(
    n: int, kind: str, async_op: bool
) -> None:
    got = run_members(
        _ops_body, f"ms{n}{kind[0]}", (True,) * n, args=((n, kind, async_op, None),) * n
    )
    _check(got, n, "shm")


@pytest.mark.parametrize("n", [2, 4])
def test_one_member_voting_against_shared_memory_keeps_every_member_on_gloo(n: int) -> None:
    args = tuple((n, "torch", False, "0" if r == n - 1 else None) for r in range(n))
    got = run_members(_ops_body, f"mv{n}", (True,) * n, args=args)
    _check(got, n, "gloo")


def _bad_args_body(coll: Any, rank: int, key: str, n: int) -> tuple[str | None, list[str]]:
    g = create_multi_group(coll, _names(key, n))
    x = torch.ones(4)
    g.allreduce(x, timeout=60)
    seen = []
    for call in (
        lambda: g.allreduce(torch.ones(2, dtype=torch.bool)),
        lambda: g.allreduce(torch.ones(2), op="mean"),
        lambda: g.reduce(torch.ones(2), dst=n),
        lambda: g.broadcast_tensor(torch.ones(2), src=-1),
        lambda: g.reduce_scatter(torch.ones(2), [torch.ones(2)]),
        lambda: g.allgather(torch.ones(2), [torch.ones(2)]),
        lambda: g.allreduce([1.0, 2.0]),
    ):
        try:
            call()
            seen.append("no error")
        except Exception as exc:
            seen.append(type(exc).__name__)
    g.allreduce(x, timeout=60)  # still usable, still on shared memory
    g.barrier(timeout=60)
    seen.append(str(x.tolist()))
    return g.collectives_transport, seen


def test_bad_arguments_raise_as_before_and_leave_the_group_usable() -> None:
    n = 3
    got = run_members(_bad_args_body, "mbad", (True,) * n, args=((n,),) * n)
    errors = ["TypeError" if i == 6 else "ValueError" for i in range(7)]
    assert got == [(r, "shm", [*errors, str([9.0] * 4)]) for r in range(n)]


def _recreate_body(coll: Any, rank: int, key: str, n: int) -> tuple[list[Any]]:
    """Close the group and create it again (its pairs are new too): it meets again."""
    out = []
    for i in range(3):
        g = create_multi_group(coll, _names(key, n))
        x = torch.full((4,), float(i + 1))
        g.allreduce(x, timeout=60)
        out.append((g.collectives_transport, x.tolist()))
        g.barrier(timeout=60)  # no member closes while another still finishes
        g.close()
    return (out,)


def test_a_closed_group_created_again_meets_again_on_shared_memory() -> None:
    n = 3
    got = run_members(_recreate_body, "mrec", (True,) * n, args=((n,),) * n)
    want = [("shm", [float(n * (i + 1))] * 4) for i in range(3)]
    assert got == [(r, want) for r in range(n)]


def _dies_body(coll: Any, rank: int, key: str, n: int, victim: int) -> tuple[dict[str, Any]]:
    g = create_multi_group(coll, _names(key, n))
    g.allreduce(torch.ones(4), timeout=60)
    out: dict[str, Any] = {"transport": g.collectives_transport}
    if rank == victim:
        time.sleep(0.5)
        os._exit(3)

    def allreduces() -> None:
        for _ in range(1000):  # the victim dies during one of these
            g.allreduce(torch.ones(1 << 18), timeout=120)

    return ({**out, **after_a_death(g, allreduces)},)


def test_member_dying_mid_run_fails_the_others_with_peer_error_within_seconds() -> None:
    n, victim = 4, 2  # rank 0 is no neighbour of the victim on the ring
    got = run_members(
        _dies_body, "mdie", (True,) * n, args=((n, victim),) * n, results=n - 1, timeout=120
    )
    assert [g[0] for g in got] == [r for r in range(n) if r != victim]
    for _rank, out in got:
        assert out["transport"] == "shm", out
        assert out["first"] == "PeerError", out
        assert out["seconds"] < 15.0, out
        assert out["second"] == "PeerGoneError", out  # a GroupBrokenError and a PeerError
        assert out["second_cause"] == "PeerError", out


def test_transport_is_undecided_until_the_first_collective_and_gloo_for_ranked_groups() -> None:
    store = make_store()
    coll = Collective("s0", store)
    try:
        g = create_multi_group(coll, ["s0", "s1", "s2"])
        assert g.collectives_transport is None
        assert join_ranked_group(coll, "ranked", 3, 0).collectives_transport == "gloo"
    finally:
        coll.close()
    ops = torch.distributed.ReduceOp
    assert [op_name(o) for o in (ops.SUM, ops.PRODUCT, ops.MIN, ops.MAX)] == [
        "sum",
        "product",
        "min",
        "max",
    ]
    assert op_name(ops.BAND) is None  # gloo only
