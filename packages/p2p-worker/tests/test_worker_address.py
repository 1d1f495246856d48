from __future__ import annotations

import pickle

import pytest

from p2p_worker import WorkerAddress, WorkerInfo


def test_name_and_navigation() -> None:
    addr = WorkerAddress("Worker_group_MyWorker", (0, 1))
    assert addr.get_name() == "Worker_group_MyWorker:0:1"
    assert str(addr) == "Worker_group_MyWorker:0:1"
    assert addr.rank == 1
    parent = addr.get_parent_address()
    assert parent == WorkerAddress("Worker_group_MyWorker", 0)
    assert addr.get_parent_rank() == 0
    assert parent is not None
    assert parent.get_parent_rank() is None
    root = parent.get_parent_address()
    assert root == WorkerAddress("Worker_group_MyWorker")
    assert root is not None
    assert root.get_name() == "Worker_group_MyWorker"
    assert root.rank is None
    assert root.get_parent_address() is None
    assert parent.get_child_address(1) == addr
    assert root.get_child_address(3).get_name() == "Worker_group_MyWorker:3"


def test_parse_round_trip() -> None:
    for name in ("g", "g:0", "g:12:0:7", "a.b-c_d:3"):
        addr = WorkerAddress.from_name(name)
        assert addr.get_name() == name
        assert WorkerAddress.from_name(addr.get_name()) == addr
    assert WorkerAddress.from_name("g:2:5").ranks == (2, 5)


@pytest.mark.parametrize("bad", ["", "g:", "g:x", "g:-1", "g::1", ":0", "g:1.5", "has space:0"])
def test_parse_rejects_bad_names(bad: str) -> None:
    with pytest.raises(ValueError, match=r"name|group name"):
        WorkerAddress.from_name(bad)


def test_constructor_checks_arguments() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        WorkerAddress(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="':'"):
        WorkerAddress("a:b", 0)
    with pytest.raises(ValueError, match=">= 0"):
        WorkerAddress("g", -1)
    with pytest.raises(TypeError, match="ints"):
        WorkerAddress("g", ["0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="bool"):
        WorkerAddress("g", True)
    with pytest.raises(TypeError, match="must be a str"):
        WorkerAddress.from_name(None)  # type: ignore[arg-type]


def test_hashable_ordered_immutable_picklable() -> None:
    a0, a1, a10, b0 = (
        WorkerAddress("a", 0),
        WorkerAddress("a", 1),
        WorkerAddress("a", (1, 0)),
        WorkerAddress("b", 0),
    )
    assert sorted([b0, a10, a1, a0]) == [a0, a1, a10, b0]
    assert a0 < a1 < a10 < b0
    assert b0 > a0
    assert a0 <= WorkerAddress("a", 0)
    assert len({a0, WorkerAddress("a", [0]), a1}) == 2
    assert {a0: "x"}[WorkerAddress.from_name("a:0")] == "x"
    assert pickle.loads(pickle.dumps(a10)) == a10
    with pytest.raises(AttributeError):
        a0.ranks = (5,)  # type: ignore[misc]
    assert a0 != "a:0"


def test_worker_info() -> None:
    info = WorkerInfo(WorkerAddress("g", 2), 2, 0, None, "127.0.0.1", world_size=4, local_rank=2)
    assert info.address.get_name() == "g:2"
    assert info.available_gpus == []
    assert info.gpu_id is None
    assert pickle.loads(pickle.dumps(info)) == info
