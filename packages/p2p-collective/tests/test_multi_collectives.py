"""N-member groups: every collective against locally computed values, on four real processes."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Iterator

import multi_tasks as mt
import numpy as np
import pytest
import torch

from p2p_collective import (
    Collective,
    CollectiveGroup,
    MultiCollectiveGroup,
    PeerError,
    create_multi_group,
    join_ranked_group,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def quad() -> Iterator[mt.Quad]:
    q = mt.Quad()
    yield q
    q.close()


def _expected(async_op: bool) -> dict[str, object]:
    x = [mt.inputs(r, torch.float64).numpy() for r in range(mt.N)]
    prod = np.prod(x, axis=0)
    return {
        "allreduce_sum": np.sum(x, axis=0).tolist(),
        "allreduce_product": prod.tolist(),
        "allreduce_min": np.min(x, axis=0).tolist(),
        "allreduce_max": np.max(x, axis=0).tolist(),
        "allreduce_int64": np.sum(x, axis=0).astype(np.int64).tolist(),
        "allgather": [v.tolist() for v in x],
        "allgather_into": [v.tolist() for v in x],
        "broadcast_tensor": x[1].tolist(),
    }


@pytest.mark.parametrize(("kind", "async_op"), [("torch", False), ("numpy", True)])
def test_every_collective_matches_local_values(quad: mt.Quad, kind: str, async_op: bool) -> None:
    outs = quad.run(mt.t_all_ops, f"ops-{kind}", kind, async_op)
    x = [mt.inputs(r, torch.float64).numpy() for r in range(mt.N)]
    expected = _expected(async_op)
    for rank, out in enumerate(outs):
        for key, value in expected.items():
            assert out[key] == value, (rank, key)
        # reduce: the sum on dst=2 only; the others keep their input
        assert out["reduce"] == (np.sum(x, axis=0).tolist() if rank == 2 else x[rank].tolist())
        # reduce_scatter: inputs[i] = x * (i + 1), member r gets sum over members of x * (r + 1)
        assert out["reduce_scatter"] == (np.sum(x, axis=0) * (rank + 1)).tolist()


def test_broadcast_of_objects_and_tensor_containers(quad: mt.Quad) -> None:
    outs = quad.run(mt.t_broadcast_objects, "objs", 1)
    sent = [*mt.payloads(), {"k": torch.ones(4)}]
    for got in outs:
        assert len(got) == len(sent)
        for g, s in zip(got, sent, strict=True):
            assert type(g) is type(s)
            if isinstance(s, torch.Tensor):
                assert torch.equal(g, s)
            elif isinstance(s, (dict, OrderedDict)):
                assert list(g) == list(s)
                for k in s:
                    assert (
                        torch.equal(g[k], s[k]) if isinstance(s[k], torch.Tensor) else g[k] == s[k]
                    )
            elif isinstance(s, (list, tuple)):
                assert all(torch.equal(a, b) for a, b in zip(g, s, strict=True))
            else:
                assert g == s


def test_interleaved_p2p_and_collectives_keep_their_order(quad: mt.Quad) -> None:
    outs = quad.run(mt.t_interleaved, "inter")
    for rank, got in enumerate(outs):
        expect: list[object] = []
        for i in range(5):
            if rank == 0:
                expect.append(None)
            elif rank == 1:
                expect.append(i)
            expect.append([float(4 * i + 6)] * 3)
            expect.append(i * 100)
        assert got == expect


def test_barrier_waits_for_the_last_member(quad: mt.Quad) -> None:
    assert quad.run(mt.t_barrier, "bar") == [True] * mt.N


def test_member_joining_late_times_out_cleanly_and_retry_works(quad: mt.Quad) -> None:
    outs = quad.run(mt.t_partial_then_retry, "late")
    for rank, seen in enumerate(outs):
        first = [] if rank == 3 else ["CollectiveTimeoutError"]
        assert seen == [*first, str([4.0, 4.0])]


def test_point_to_point_inside_the_group(quad: mt.Quad) -> None:
    assert quad.run(mt.t_send_recv, "sr") == [[0.0, 0.0], [7.0, 8.0], [0.0, 0.0], [0.0, 0.0]]


def test_dead_member_fails_the_others_within_seconds() -> None:
    q = mt.Quad()
    try:
        for cmd in q.cmd:
            cmd.put((mt.t_dies, ("dies", 3)))
        outs = [q.res[r].get(timeout=120) for r in range(3)]
    finally:
        q.close()
    for status, out in outs:
        assert status == "ok", out
        assert out["first"] == "PeerError", out
        assert out["seconds"] < 15.0, out
        assert out["second"] == "PeerGoneError"  # a GroupBrokenError and a PeerError
        assert out["second_cause"] == "PeerError"


def test_group_dispatch_and_argument_errors() -> None:
    store = mt.make_store()
    coll = Collective("m0", store)
    try:
        g = create_multi_group(coll, ["m2", "m0", "m1"])
        assert isinstance(g, MultiCollectiveGroup)
        assert (g.rank, g.world_size, g.member_names) == (0, 3, ["m0", "m1", "m2"])
        assert create_multi_group(coll, ["m0", "m1", "m2"]) is g
        assert coll.create_collective_group(["m1", "m2", "m0"]) is g
        assert isinstance(coll.create_collective_group(["m0", "m1"]), CollectiveGroup)
        with pytest.raises(ValueError, match="src"):
            g.broadcast(1, src=3)
        with pytest.raises(ValueError, match="op"):
            g.allreduce(torch.ones(2), op="mean")
        with pytest.raises(TypeError, match="numpy"):
            g.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="dtype"):
            g.allreduce(torch.ones(2, dtype=torch.bool))
        ro = np.ones(3)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            g.allreduce(ro)
        with pytest.raises(ValueError, match="timeout"):
            g.barrier(timeout=-1)
        # One rule with two-member groups: bool and NaN are refused, not read as 1 s / NaN.
        for bad in (True, float("nan"), "5"):
            with pytest.raises(ValueError, match=r"timeout: got .*the configured op_timeout"):
                g.barrier(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"timeout: got True; .*or None \(no limit\)"):
            Collective("m9", store, timeout=True)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="inputs"):
            g.reduce_scatter(torch.ones(2), [torch.ones(2)])
        with pytest.raises(ValueError, match="own address"):
            create_multi_group(coll, ["x", "y", "z"])
        with pytest.raises(ValueError, match="rank"):
            join_ranked_group(coll, "default", 4, 4)
        r = join_ranked_group(coll, "default", 4, 2)
        assert (r.rank, r.world_size) == (2, 4)
        g.close()
        assert g.closed
    finally:
        coll.close()


def test_errors_pickle_with_cause() -> None:
    err = PeerError("member gone")
    err.__cause__ = RuntimeError("eof")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == "member gone"
    assert isinstance(back.__cause__, RuntimeError)


def test_large_reduce_scatter_runs_the_ring_and_matches_local_values(quad: mt.Quad) -> None:
    outs = quad.run(mt.t_ring_reduce_scatter, "ring")
    numel = 1 << 16
    base = torch.arange(numel, dtype=torch.float64) % 7
    for rank, got in enumerate(outs):
        block = torch.stack([base + (rank + 1) * (m + 1) for m in range(mt.N)])
        expect = {
            "sum": block.sum(0),
            "product": block.prod(0),
            "min": block.min(0).values,
            "max": block.max(0).values,
        }
        for op, value in expect.items():
            assert got[op] == value[:8].tolist() + value[-8:].tolist(), (rank, op)
        alias = float(sum(rank + m for m in range(mt.N)))
        assert got["alias"] == [alias, alias]
