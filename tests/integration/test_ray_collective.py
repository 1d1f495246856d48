"""Ray-style collective code against ``p2p_worker.compat``, with only the import changed.

Written from ``ray.util.collective``'s documented behaviour: plain ``@ray.remote`` actors
after a plain ``ray.init()`` (no p2p Cluster), groups initialized in the members or
declared from the driver, every operation with several dtypes, numpy arrays in place, a
group of one, two groups in the same actors, destroy and re-create, and the errors Ray
raises for bad ranks, sizes and tensors (the group stays usable afterwards).

The same file runs against Ray's own library to check that the tests say what Ray
does: ``P2P_RAYCOLL_MODULE=ray.util.collective pytest tests/integration/test_ray_collective.py``
(each test then gets fresh actors, since Ray's gloo backend keeps one process group per
process). The p2p-only behaviour (timeouts, a killed member, shared memory, jobs that
never meet) is in ``test_ray_collective_extras.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from plain_ray import plain_local_ray

if os.environ.get("P2P_RAYCOLL_MODULE") == "ray.util.collective":  # the parity run
    import ray.util.collective as col
    from ray.util.collective.types import ReduceOp
else:
    import p2p_worker.compat as col
    from p2p_worker.compat.types import ReduceOp

UNDER_RAY = col.__name__ == "ray.util.collective"

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

CALL_TIMEOUT = 90.0
GROUP_NAMES = ("default", "g1", "g2", "declared", "solo")

TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]
NUMPY_DTYPES = [np.float32, np.float64, np.int32, np.int64]


@ray.remote(num_cpus=0)
class Member:
    """A plain Ray actor that runs whatever function it is given (shipped by value)."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def _init(world_size: int, rank: int, group_name: str = "default") -> bool:
    col.init_collective_group(world_size, rank, backend="gloo", group_name=group_name)
    return col.is_group_initialized(group_name)


def _destroy(names: tuple[str, ...]) -> None:
    for name in names:
        if col.is_group_initialized(name):
            col.destroy_collective_group(name)


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    """A plain embedded Ray on loopback for this module (``ray.init``, no p2p Cluster)."""
    with plain_local_ray(sys.modules[__name__]):
        yield


_pool: list[Any] = []


@pytest.fixture
def team(ray_up: None) -> Iterator[Callable[[int], list[Any]]]:
    """``team(n)``: n member actors (reused between tests here; fresh ones under Ray)."""
    used: list[Any] = []

    def make(n: int) -> list[Any]:
        if UNDER_RAY:
            used.extend(Member.remote() for _ in range(n))
            return used[-n:]
        while len(_pool) < n:
            _pool.append(Member.remote())
        used[:] = _pool[:n]
        return used

    yield make
    if UNDER_RAY:
        for actor in used:
            ray.kill(actor)
    else:
        ray.get([m.run.remote(_destroy, GROUP_NAMES) for m in used], timeout=CALL_TIMEOUT)


def on_all(members: list[Any], fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn(rank, *args)`` in every member at once; results by rank."""
    refs = [m.run.remote(fn, rank, *args) for rank, m in enumerate(members)]
    return ray.get(refs, timeout=CALL_TIMEOUT)  # type: ignore[no-any-return]


def setup_group(members: list[Any], group_name: str = "default") -> None:
    n = len(members)
    assert on_all(members, lambda r: _init(n, r, group_name)) == [True] * n


# -- every operation --------------------------------------------------------------------


def _every_op(rank: int) -> dict[str, Any]:
    n = col.get_collective_group_size()
    assert col.get_rank() == rank
    out: dict[str, Any] = {}
    t = torch.full((4,), float(rank + 1))
    col.allreduce(t)
    out["allreduce"] = t.tolist()
    b = torch.full((3,), float(rank))
    col.broadcast(b, src_rank=n - 1)
    out["broadcast"] = b.tolist()
    red = torch.full((2,), float(rank + 1))
    col.reduce(red, dst_rank=1)
    out["reduce"] = red.tolist()
    gathered = [torch.zeros(2) for _ in range(n)]
    col.allgather(gathered, torch.full((2,), rank * 10.0))
    out["allgather"] = [g.tolist() for g in gathered]
    mine = torch.zeros(2)
    col.reducescatter(mine, [torch.full((2,), 10.0 * rank + i) for i in range(n)])
    out["reducescatter"] = mine.tolist()
    col.barrier()
    return out


def test_every_operation_in_members_that_initialized_the_group(team: Any) -> None:
    members = team(3)
    setup_group(members)
    outs = on_all(members, _every_op)
    for rank, o in enumerate(outs):
        assert o["allreduce"] == [6.0] * 4
        assert o["broadcast"] == [2.0] * 3
        assert o["reduce"] == ([6.0, 6.0] if rank == 1 else [rank + 1.0] * 2)
        assert o["allgather"] == [[0.0, 0.0], [10.0, 10.0], [20.0, 20.0]]
        assert o["reducescatter"] == [30.0 + 3 * rank] * 2


def _point_to_point(rank: int, n: int) -> list[list[float]]:
    got = []
    if rank == 0:
        for peer in range(1, n):
            for k in range(3):  # three messages in a row arrive in order
                col.send(torch.full((5,), 100.0 * peer + k), peer)
        for peer in range(1, n):
            back = np.zeros(5, dtype=np.float32)
            col.recv(back, peer)
            got.append(back.tolist())
    else:
        for _ in range(3):
            buf = torch.zeros(5)
            col.recv(buf, 0)
            got.append(buf.tolist())
        col.send(np.full(5, 2.0 * rank, dtype=np.float32), 0)
    return got


def test_send_and_recv_between_members(team: Any) -> None:
    members = team(3)
    setup_group(members)
    outs = on_all(members, _point_to_point, 3)
    assert outs[0] == [[2.0] * 5, [4.0] * 5]
    for rank in (1, 2):
        assert outs[rank] == [[100.0 * rank + k] * 5 for k in range(3)]


def _dtypes(rank: int, names: list[str]) -> dict[str, Any]:
    n = col.get_collective_group_size()
    out = {}
    for name in names:
        dtype = getattr(torch, name)
        t = torch.full((6,), rank + 1, dtype=dtype)
        col.allreduce(t)
        b = torch.full((3,), rank + 2, dtype=dtype)
        col.broadcast(b, src_rank=0)
        gathered = [torch.zeros(2, dtype=dtype) for _ in range(n)]
        col.allgather(gathered, torch.full((2,), rank, dtype=dtype))
        p2p = torch.full((7,), 5 if rank == 0 else 0, dtype=dtype)
        if rank == 0:
            col.send(p2p, 1)
        else:
            col.recv(p2p, 0)
        out[name] = (
            t.float().tolist(),
            b.float().tolist(),
            [g.float().tolist() for g in gathered],
            p2p.float().tolist(),
            str(t.dtype),
        )
    return out


def test_torch_dtypes(team: Any) -> None:
    members = team(2)
    setup_group(members)
    names = [str(d).removeprefix("torch.") for d in TORCH_DTYPES]
    for o in on_all(members, _dtypes, names):
        for name in names:
            summed, bcast, gathered, p2p, dtype = o[name]
            assert summed == [3.0] * 6, name
            assert bcast == [2.0] * 3, name
            assert gathered == [[0.0, 0.0], [1.0, 1.0]], name
            assert p2p == [5.0] * 7, name
            assert dtype == f"torch.{name}"


def _numpy_in_place(rank: int, names: list[str]) -> dict[str, Any]:
    n = col.get_collective_group_size()
    out: dict[str, Any] = {}
    for name in names:
        dtype = np.dtype(name)
        a = np.full(4, rank + 1, dtype=dtype)
        col.allreduce(a, op=ReduceOp.MAX)
        b = np.full(4, rank, dtype=dtype)
        col.broadcast(b, src_rank=1)
        r = np.full(4, rank + 1, dtype=dtype)
        col.reduce(r, dst_rank=0)
        gathered = [np.zeros(2, dtype=dtype) for _ in range(n)]
        col.allgather(gathered, np.full(2, rank + 7, dtype=dtype))
        rs = np.zeros(3, dtype=dtype)
        col.reducescatter(rs, [np.full(3, i + 1, dtype=dtype) for i in range(n)])
        p2p = np.full(3, 9 if rank == 1 else 0, dtype=dtype)
        if rank == 1:
            col.send(p2p, 0)
        else:
            col.recv(p2p, 1)
        out[name] = [
            x.tolist() if isinstance(x, np.ndarray) else [g.tolist() for g in x]
            for x in (a, b, r, gathered, rs, p2p)
        ] + [str(a.dtype)]
    return out


def test_numpy_arrays_in_place(team: Any) -> None:
    members = team(2)
    setup_group(members)
    names = [np.dtype(d).name for d in NUMPY_DTYPES]
    outs = on_all(members, _numpy_in_place, names)
    for rank, o in enumerate(outs):
        for name in names:
            a, b, r, gathered, rs, p2p, dtype = o[name]
            assert a == [2] * 4
            assert b == [1] * 4
            assert r == ([3] * 4 if rank == 0 else [rank + 1] * 4)
            assert gathered == [[7, 7], [8, 8]]
            assert rs == [2 * (rank + 1)] * 3
            assert p2p == [9] * 3
            assert dtype == name


def _reduce_ops(rank: int) -> dict[str, Any]:
    n = col.get_collective_group_size()
    out = {}
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
        t = torch.tensor([rank + 2.0, 10.0 - rank])
        col.allreduce(t, op=op)
        r = torch.tensor([rank + 2.0])
        col.reduce(r, dst_rank=n - 1, op=op)
        rs = torch.zeros(1)
        col.reducescatter(rs, [torch.tensor([rank + i + 1.0]) for i in range(n)], op=op)
        out[op.name] = (t.tolist(), r.tolist(), rs.tolist())
    return out


def test_reduce_ops(team: Any) -> None:
    members = team(3)
    setup_group(members)
    outs = on_all(members, _reduce_ops)
    for rank, o in enumerate(outs):
        last = rank == 2
        assert o["SUM"][0] == [9.0, 27.0]
        assert o["PRODUCT"][0] == [24.0, 720.0]
        assert o["MIN"][0] == [2.0, 8.0]
        assert o["MAX"][0] == [4.0, 10.0]
        assert o["SUM"][1] == ([9.0] if last else [rank + 2.0])
        assert o["PRODUCT"][1] == ([24.0] if last else [rank + 2.0])
        assert o["MAX"][1] == ([4.0] if last else [rank + 2.0])
        # member m contributes m + i + 1 to member i's result
        values = [m + rank + 1.0 for m in range(3)]
        assert o["SUM"][2] == [sum(values)]
        assert o["PRODUCT"][2] == [values[0] * values[1] * values[2]]
        assert o["MIN"][2] == [min(values)]
        assert o["MAX"][2] == [max(values)]


# -- groups declared from the driver ----------------------------------------------------


def _declared_member(rank_hint: int) -> tuple[int, int, list[float], bool]:
    t = torch.full((2,), float(rank_hint + 1))
    col.allreduce(t, "declared")  # the first call joins with the declared rank
    rank = col.get_rank("declared")
    buf = torch.full((1,), float(rank))
    col.broadcast(buf, src_rank=0, group_name="declared")
    col.barrier("declared")
    initialized = col.is_group_initialized("declared")
    return rank, col.get_collective_group_size("declared"), t.tolist() + buf.tolist(), initialized


def test_group_declared_from_the_driver(team: Any) -> None:
    members = team(3)
    col.create_collective_group(members, 3, [2, 0, 1], backend="gloo", group_name="declared")
    with pytest.raises(RuntimeError):  # a second declaration of the same name
        col.create_collective_group(members, 3, [0, 1, 2], backend="gloo", group_name="declared")
    outs = on_all(members, _declared_member)
    assert [o[0] for o in outs] == [2, 0, 1]
    for _rank, size, values, initialized in outs:
        assert size == 3
        assert values == [6.0, 6.0, 0.0]  # rank 0 (the second actor) broadcast 0.0
        assert initialized is True


def test_bad_declarations_raise_runtime_error(team: Any) -> None:
    members = team(2)
    with pytest.raises(RuntimeError):  # a rank per actor
        col.create_collective_group(members, 2, [0], backend="gloo", group_name="g1")
    with pytest.raises(RuntimeError):  # ranks are a permutation of 0..n-1
        col.create_collective_group(members, 2, [0, 2], backend="gloo", group_name="g1")
    with pytest.raises(RuntimeError):  # world size > 0
        col.create_collective_group(members, 0, [0, 1], backend="gloo", group_name="g1")


# -- group of one, two groups, destroy and re-create -------------------------------------


def _solo(rank: int) -> list[Any]:
    col.init_collective_group(1, 0, backend="gloo", group_name="solo")
    t = torch.tensor([1.0, 2.0])
    col.allreduce(t, "solo")
    col.broadcast(t, 0, "solo")
    col.reduce(t, 0, "solo")
    gathered = [torch.zeros(2)]
    col.allgather(gathered, t, "solo")
    rs = torch.zeros(2)
    col.reducescatter(rs, [torch.tensor([5.0, 6.0])], "solo")
    col.barrier("solo")
    info = [col.get_rank("solo"), col.get_collective_group_size("solo")]
    col.destroy_collective_group("solo")
    return [t.tolist(), gathered[0].tolist(), rs.tolist(), info]


def test_group_of_one(team: Any) -> None:
    (member,) = team(1)
    out = ray.get(member.run.remote(_solo, 0), timeout=CALL_TIMEOUT)
    assert out == [[1.0, 2.0], [1.0, 2.0], [5.0, 6.0], [0, 1]]


def _two_groups(rank: int) -> list[float]:
    col.init_collective_group(2, rank, backend="gloo", group_name="g1")
    col.init_collective_group(2, rank, backend="gloo", group_name="g2")
    a, b = torch.tensor([rank + 1.0]), torch.tensor([10.0 * (rank + 1)])
    col.allreduce(a, "g1")
    col.allreduce(b, "g2", op=ReduceOp.MAX)
    c = torch.tensor([float(rank)])
    col.broadcast(c, 1, "g2")
    col.allreduce(a, "g1")  # interleaved use of the two groups
    col.barrier("g1")
    col.barrier("g2")
    return [a.item(), b.item(), c.item()]


def test_two_groups_with_different_names_in_the_same_actors(team: Any) -> None:
    members = team(2)
    assert on_all(members, _two_groups) == [[6.0, 20.0, 1.0]] * 2


def _destroy_and_recreate(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    col.init_collective_group(2, rank, backend="gloo", group_name="default")
    t = torch.tensor([rank + 1.0])
    col.allreduce(t)
    col.barrier()
    col.destroy_collective_group()
    out["after"] = (
        col.is_group_initialized("default"),
        col.get_rank(),
        col.get_collective_group_size(),
    )
    try:
        col.allreduce(torch.ones(1))
        out["destroyed_op"] = None
    except RuntimeError:
        out["destroyed_op"] = "RuntimeError"
    col.init_collective_group(2, 1 - rank, backend="gloo", group_name="default")  # ranks swapped
    u = torch.tensor([10.0 * (rank + 1)])
    col.allreduce(u)
    v = torch.tensor([float(rank)])
    col.broadcast(v, 0)
    col.barrier()
    out["values"] = (t.item(), u.item(), v.item(), col.get_rank())
    return out


def test_destroy_and_recreate(team: Any) -> None:
    members = team(2)
    outs = on_all(members, _destroy_and_recreate)
    for rank, o in enumerate(outs):
        assert o["after"] == (False, -1, -1)
        assert o["destroyed_op"] == "RuntimeError"
        # the new rank 0 is the second actor, whose own rank was 1
        assert o["values"] == (3.0, 30.0, 1.0, 1 - rank)


# -- errors (and the group stays usable) --------------------------------------------------


def _errors(rank: int) -> dict[str, Any]:
    def kind(fn: Callable[[], Any]) -> list[str]:
        """The builtin types Ray raises that the error is an instance of."""
        try:
            fn()
        except Exception as exc:
            bases = (AssertionError, ValueError, RuntimeError, TypeError)
            return [b.__name__ for b in bases if isinstance(exc, b)]
        return []

    n = col.get_collective_group_size()
    t = torch.ones(2)
    out = {
        "init twice": kind(lambda: col.init_collective_group(n, rank, "gloo", "default")),
        "rank >= world_size": kind(lambda: col.init_collective_group(2, 2, "gloo", "g1")),
        "world_size 0": kind(lambda: col.init_collective_group(0, 0, "gloo", "g1")),
        "unknown backend": kind(lambda: col.init_collective_group(2, 0, "mpi", "g1")),
        "not initialized": kind(lambda: col.allreduce(t, "no-such-group")),
        "not a tensor": kind(lambda: col.allreduce([1.0, 2.0])),
        "broadcast src out of range": kind(lambda: col.broadcast(t, src_rank=n)),
        "reduce dst negative": kind(lambda: col.reduce(t, dst_rank=-1)),
        "send to self": kind(lambda: col.send(t, rank)),
        "send out of range": kind(lambda: col.send(t, n + 3)),
        "recv from self": kind(lambda: col.recv(t, rank)),
        "allgather list too short": kind(lambda: col.allgather([torch.ones(2)], t)),
        "allgather not a list": kind(
            lambda: col.allgather(tuple(torch.ones(2) for _ in range(n)), t)
        ),  # type: ignore[arg-type]
        "reducescatter list too long": kind(
            lambda: col.reducescatter(t, [torch.ones(2) for _ in range(n + 1)])
        ),
        "reducescatter shape": kind(
            lambda: col.reducescatter(torch.ones(3), [torch.ones(2) for _ in range(n)])
        ),
    }
    after = torch.full((2,), float(rank + 1))
    col.allreduce(after)  # still usable
    out["after"] = after.tolist()
    return out


def test_bad_ranks_sizes_and_tensors_raise_rays_exception_types(team: Any) -> None:
    members = team(2)
    setup_group(members)
    expected = {
        "init twice": "RuntimeError",
        "rank >= world_size": "AssertionError",
        "world_size 0": "AssertionError",
        "unknown backend": "ValueError",
        "not initialized": "RuntimeError",
        "not a tensor": "RuntimeError",
        "broadcast src out of range": "ValueError",
        "reduce dst negative": "ValueError",
        "send to self": "RuntimeError",
        "send out of range": "ValueError",
        "recv from self": "RuntimeError",
        "allgather list too short": "RuntimeError",
        "allgather not a list": "RuntimeError",
        "reducescatter list too long": "RuntimeError",
        "reducescatter shape": "ValueError",
    }
    for out in on_all(members, _errors):
        assert out.pop("after") == [3.0, 3.0]  # the group is still usable
        for case, want in expected.items():
            # Ray raises exactly ``want``; ours is an instance of it (and of p2p types).
            assert want in out[case], (case, out[case])
