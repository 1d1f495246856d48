"""Read-only numpy arrays from Ray's object store, written in place as Ray's library does.

An actor that gets a numpy array through Ray (an argument, or ``ray.get``) holds a
read-only view of the object in the node's shared-memory object store. Ray's collective
library writes results into such an array all the same, and so does ``p2p_worker.compat``:
every operation that writes its result in place fills the read-only array with the right
values, the process gets one ``ReadOnlyArrayWarning`` (and not torch's own warning about
non-writable arrays), and the group goes on working. The hazard the warning names is real:
another reader of the same object on the node sees the written result.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
import torch
from plain_ray import fresh_members, plain_local_ray

import p2p_worker.compat as col

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

CALL_TIMEOUT = 120.0
N_ITEMS = 50_000  # float32: 200 kB, above Ray's inline limit, so the object is in shared memory
OPS = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter", "recv")


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    """A plain embedded Ray on loopback for this module (``ray.init``, no p2p Cluster)."""
    with plain_local_ray(sys.modules[__name__]):
        yield


def _objects(world_size: int) -> list[dict[str, list[Any]]]:
    """Per rank, per operation: the refs of the arrays that rank passes (put by the driver).

    Rank ``r`` starts every array at ``r + 1``; the ``k``-th input of ``reducescatter`` at
    ``(r + 1) * (k + 1)``. The refs travel inside a list, so the member ``ray.get`` s them.
    """
    out = []
    for r in range(world_size):
        full = {
            op: [ray.put(np.full(N_ITEMS, r + 1, dtype=np.float32))]
            for op in ("allreduce", "broadcast", "reduce", "recv")
        }
        full["allgather"] = [
            ray.put(np.zeros(N_ITEMS, dtype=np.float32)) for _ in range(world_size)
        ]
        full["reducescatter"] = [ray.put(np.zeros(N_ITEMS, dtype=np.float32))] + [
            ray.put(np.full(N_ITEMS, (r + 1) * (k + 1), dtype=np.float32))
            for k in range(world_size)
        ]
        out.append(full)
    return out


def _every_op_on_read_only_arrays(
    rank: int, world_size: int, name: str, refs: dict[str, list[Any]], ring: str
) -> dict[str, Any]:
    """Run each in-place operation on arrays got from the object store; report what it saw."""
    os.environ["P2P_RAYCOLL_RING"] = ring
    col.init_collective_group(world_size, rank, "gloo", name)
    got = {op: [ray.get(ref) for ref in op_refs] for op, op_refs in refs.items()}
    report: dict[str, Any] = {
        "read_only": all(not a.flags.writeable for arrays in got.values() for a in arrays)
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a second warning would show: none is deduplicated
        col.allreduce(got["allreduce"][0], name, timeout=60)
        col.broadcast(got["broadcast"][0], 0, name, timeout=60)
        col.reduce(got["reduce"][0], 0, name, timeout=60)
        col.allgather(got["allgather"], torch.full((N_ITEMS,), rank + 1.0), name, timeout=60)
        out, *items = got["reducescatter"]
        col.reducescatter(out, items, name, timeout=60)
        if rank == 0:
            col.send(torch.full((N_ITEMS,), 7.0), 1, name, timeout=60)
        elif rank == 1:
            col.recv(got["recv"][0], 0, name, timeout=60)
        # the same again: the second round writes as well, and warns no more
        col.allreduce(got["allreduce"][0], name, timeout=60)
        check = torch.ones(3)  # and the group goes on with writable tensors
        col.allreduce(check, name, timeout=60)
    ours = [w for w in caught if issubclass(w.category, col.ReadOnlyArrayWarning)]
    report["ours"] = [(str(w.message), os.path.basename(w.filename)) for w in ours]
    report["torch_own"] = [str(w.message) for w in caught if "not writable" in str(w.message)]
    report["values"] = {op: [sorted(set(a.tolist())) for a in arrays] for op, arrays in got.items()}
    report["check"] = check.tolist()
    return report


@pytest.mark.parametrize(
    ("world_size", "ring"),
    [(2, "1"), (3, "1"), (3, "0")],
    ids=["two-shm", "three-ring", "three-gloo"],
)
def test_every_in_place_op_writes_into_read_only_arrays_and_warns_once(
    ray_up: None, world_size: int, ring: str
) -> None:
    name = f"ro-{world_size}-{ring}"
    objects = _objects(world_size)
    with fresh_members(world_size) as team:  # fresh processes: nothing warned before
        reports = ray.get(
            [
                m.run.remote(_every_op_on_read_only_arrays, r, world_size, name, objects[r], ring)
                for r, m in enumerate(team)
            ],
            timeout=CALL_TIMEOUT,
        )
    total = world_size * (world_size + 1) // 2
    for rank, report in enumerate(reports):
        assert report["read_only"], rank
        assert len(report["ours"]) == 1, (rank, report["ours"])
        message, filename = report["ours"][0]
        assert "read-only" in message, message
        assert "object store" in message, message
        assert filename == os.path.basename(__file__)  # points at the caller's line
        assert report["torch_own"] == [], report["torch_own"]
        values = report["values"]
        assert values["allreduce"] == [[float(total * world_size)]]  # twice: sum of sums
        assert values["broadcast"] == [[1.0]]
        if rank == 0:
            assert values["reduce"] == [[float(total)]]
        assert values["allgather"] == [[float(k + 1)] for k in range(world_size)]
        assert values["reducescatter"][0] == [float((rank + 1) * total)]
        assert values["reducescatter"][1:] == [
            [float((rank + 1) * (k + 1))] for k in range(world_size)
        ]  # the inputs are read, not written
        if rank == 1:
            assert values["recv"] == [[7.0]]
        assert report["check"] == [float(world_size)] * 3


def _allreduce_one(rank: int, name: str, refs: list[Any]) -> None:
    col.init_collective_group(2, rank, "gloo", name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", col.ReadOnlyArrayWarning)
        col.allreduce(ray.get(refs[0]), name, timeout=60)


def _read(refs: list[Any]) -> list[float]:
    return sorted(set(ray.get(refs[0]).tolist()))


def test_the_written_result_is_what_other_readers_of_the_object_see(ray_up: None) -> None:
    # What the warning names: the object changes for every reader on the node (as on Ray).
    refs = [[ray.put(np.full(N_ITEMS, r + 1, dtype=np.float32))] for r in range(2)]
    with fresh_members(3) as team:
        ray.get(
            [m.run.remote(_allreduce_one, r, "ro-shared", refs[r]) for r, m in enumerate(team[:2])],
            timeout=CALL_TIMEOUT,
        )
        assert ray.get(team[2].run.remote(_read, refs[0]), timeout=CALL_TIMEOUT) == [3.0]
