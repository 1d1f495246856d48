"""Child workers on a real embedded Ray cluster: addresses, send/recv, errors, cleanup.

Rank 0 of the root group ``kin`` launches two children (``kin:0:0`` and ``kin:0:1``)
from inside a method; a second root group ``kin_peer`` is another group of the job.
Every message below crosses real processes through the job's store and p2p-collective.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch

from p2p_worker import (
    Cluster,
    PackedPlacementStrategy,
    PlacementError,
    Worker,
    WorkerAddress,
    WorkerError,
    WorkerGroup,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ROOT = "kin"
PEER = "kin_peer"
TWO = PackedPlacementStrategy(2, cpus_per_worker=0)


class Child(Worker):
    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def identity(self) -> dict[str, Any]:
        me = self.worker_address
        parent = me.get_parent_address()
        assert parent is not None
        # The parent is a live worker: its actor answers under its address (on the
        # control lane, since the parent is busy waiting for this very call).
        actor = ray.get_actor(parent.get_name())
        ping = actor._p2p_ping.options(concurrency_group="p2p_ctl").remote()
        parent_pid = ray.get(ping, timeout=30)
        return {
            "address": me.get_name(),
            "parent": parent.get_name(),
            "parent_rank": me.get_parent_rank(),
            "parent_pid": parent_pid,
            "rank": self._rank,
            "world": self._world_size,
            "group_name": self._group_name,
            "env": (os.environ["RANK"], os.environ["WORLD_SIZE"]),
            "tag": self.tag,
        }

    def talk_to_parent(self) -> str:
        parent = self.worker_address.get_parent_address()
        assert parent is not None
        # By root group name and rank path: "kin", (0,)
        self.send(f"hello from {self.worker_address}", parent.root_group_name, parent.ranks)
        reply = self.recv(parent.root_group_name, parent.ranks, timeout=60)
        return f"{reply['text']}:{int(reply['t'].sum())}"

    def talk_to_peer(self) -> float:
        # A worker of another root group, by its group name and rank.
        work = self.send(torch.full((4,), float(self._rank + 1)), PEER, 0, async_op=True)
        work.wait(timeout=60)
        got: torch.Tensor = self.recv(PEER, 0, timeout=60)
        return float(got.sum())

    def family_allreduce(self) -> list[float]:
        return family_allreduce(self, float(self._rank + 1))

    def talk_to_sibling(self) -> int:
        # Siblings by their own group's name (the parent's address) and rank.
        other = 1 - self._rank
        if self._rank == 0:
            self.send_tensor(torch.arange(8), self._group_name, other)
            return 0
        buf = torch.empty(8, dtype=torch.int64)
        self.recv_tensor(buf, self._group_name, other, timeout=60)
        return int(buf.sum())


FAMILY = [(ROOT, 0), f"{ROOT}:0"]  # the parent by (group, rank), its children by group name


def family_allreduce(worker: Worker, value: float) -> list[float]:
    group = worker.create_collective(FAMILY, timeout=60)
    t = torch.full((2,), value)
    group.allreduce(t, timeout=60)
    return t.tolist()


class Parent(Worker):
    kids: WorkerGroup[Child] | None = None

    def spawn(self, tag: str) -> str:
        self.kids = Child.create_group(tag).launch_children(TWO)
        assert self.kids.parent_address == self.worker_address
        assert self.kids.cluster is None
        return self.kids.name

    def kids_identity(self) -> list[dict[str, Any]]:
        assert self.kids is not None
        return list(self.kids.identity().wait(timeout=60))

    def talk_to_kids(self) -> list[str]:
        assert self.kids is not None
        handle = self.kids.talk_to_parent()
        heard = []
        for r in range(self.kids.world_size):
            # By the child group's name (this worker's address) and the child's rank.
            heard.append(self.recv(self.kids.name, r, timeout=60))
            self.send({"text": f"hi {r}", "t": torch.ones(r + 2)}, self.kids.name, r)
        replies = handle.wait(timeout=60)
        return [*heard, *replies]

    def kids_call(self, method: str, *ranks: int) -> list[Any]:
        assert self.kids is not None
        group = self.kids.execute_on(*ranks) if ranks else self.kids
        return list(group.call(method).wait(timeout=90))

    def family_allreduce(self) -> list[Any]:
        assert self.kids is not None
        handle = self.kids.family_allreduce()
        mine = family_allreduce(self, 10.0)
        return [mine, *handle.wait(timeout=60)]

    def kids_shutdown(self) -> bool:
        assert self.kids is not None
        self.kids.shutdown()
        return self.kids.launched

    def bad_launches(self) -> list[str]:
        out = []
        for attempt in (
            lambda: Child.create_group("x").launch_children(TWO),  # one child group at a time
            lambda: Child.create_group("x").launch_children("two"),  # type: ignore[arg-type]
            lambda: Child.create_group("x").launch_children(
                PackedPlacementStrategy(1, gpus_per_worker=1)  # no GPU on this cluster
            ),
            lambda: Child.create_group("x").launch_children(TWO, max_concurrency=0),
        ):
            try:
                attempt()
            except (TypeError, ValueError, PlacementError) as exc:
                out.append(f"{type(exc).__name__}: {exc}")
            else:
                out.append("no error")
        return out

    def pid(self) -> int:
        return os.getpid()


class PeerWorker(Worker):
    def answer_child(self, child_rank: int) -> float:
        # The child by root group name and rank path.
        got: torch.Tensor = self.recv(ROOT, (0, child_rank), timeout=60)
        self.send(got * 10, f"{ROOT}:0", child_rank)
        return float(got.sum())


@pytest.fixture(scope="module")
def family(ray_session: object) -> Iterator[tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]]]:
    with Cluster(num_nodes=1) as cluster:
        parents = Parent.create_group().launch(cluster, TWO, name=ROOT)
        peer = PeerWorker.create_group().launch(
            cluster, PackedPlacementStrategy(1, cpus_per_worker=0), name=PEER
        )
        assert parents.execute_on(0).spawn("t").wait(timeout=120) == ["kin:0"]
        yield parents, peer


def test_children_addresses_extend_the_parents(
    family: tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]],
) -> None:
    parents, _ = family
    (infos,) = parents.execute_on(0).kids_identity().wait(timeout=90)
    (parent_pid,) = parents.execute_on(0).pid().wait(timeout=30)
    assert [i["address"] for i in infos] == ["kin:0:0", "kin:0:1"]
    for rank, info in enumerate(infos):
        assert WorkerAddress.from_name(info["address"]) == WorkerAddress(ROOT, (0, rank))
        assert info["parent"] == "kin:0"
        assert info["parent_rank"] == 0
        assert info["parent_pid"] == parent_pid
        assert (info["rank"], info["world"]) == (rank, 2)
        assert info["group_name"] == "kin:0"  # RLinf's _group_name: the parent's address
        assert info["env"] == (str(rank), "2")
        assert info["tag"] == "t"


def test_child_and_parent_exchange_both_ways(
    family: tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]],
) -> None:
    parents, _ = family
    (got,) = parents.execute_on(0).talk_to_kids().wait(timeout=120)
    assert got == ["hello from kin:0:0", "hello from kin:0:1", "hi 0:2", "hi 1:3"]


def test_child_talks_to_a_worker_of_another_group(
    family: tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]],
) -> None:
    parents, peer = family
    for child in (1, 0):
        answered = peer.answer_child(child)
        (sent,) = parents.execute_on(0).kids_call("talk_to_peer", child).wait(timeout=120)
        assert answered.wait(timeout=60) == [4.0 * (child + 1)]
        assert sent == [40.0 * (child + 1)]


def test_siblings_talk_by_their_group_name(
    family: tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]],
) -> None:
    parents, _ = family
    (sums,) = parents.execute_on(0).kids_call("talk_to_sibling").wait(timeout=120)
    assert sums == [0, 28]


def test_collective_over_a_parent_and_its_children(
    family: tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]],
) -> None:
    parents, _ = family
    (results,) = parents.execute_on(0).family_allreduce().wait(timeout=120)
    assert results == [[13.0, 13.0]] * 3


def test_bad_launches_are_refused_and_the_children_stay_usable(
    family: tuple[WorkerGroup[Parent], WorkerGroup[PeerWorker]],
) -> None:
    parents, _ = family
    with pytest.raises(WorkerError, match=r"launch_children\(\) runs inside a method of a"):
        Child.create_group("driver").launch_children(TWO)
    (errors,) = parents.execute_on(0).bad_launches().wait(timeout=120)
    assert errors[0].startswith("ValueError: worker kin:0 already runs the child group 'kin:0'")
    assert errors[1].startswith("TypeError: placement_strategy must be a PlacementStrategy")
    assert errors[2].startswith("PlacementError:")
    assert "GPU" in errors[2]
    assert errors[3] == "ValueError: max_concurrency must be >= 1 or None, got 0"
    (infos,) = parents.execute_on(0).kids_identity().wait(timeout=90)
    assert [i["address"] for i in infos] == ["kin:0:0", "kin:0:1"]


def _dead(name: str, timeout: float = 30.0) -> bool:
    from p2p_worker._runtime._oracle import actor_alive

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not actor_alive(name):
            return True
        time.sleep(0.2)
    return False


def test_children_end_with_their_parent_group(ray_session: object) -> None:
    with Cluster(num_nodes=1) as cluster:
        parents = Parent.create_group().launch(cluster, TWO, name="kin2")
        # Both parents launch children; rank 1 shuts its own down and launches again.
        assert parents.spawn("a").wait(timeout=120) == ["kin2:0", "kin2:1"]
        assert parents.execute_on(1).kids_shutdown().wait(timeout=60) == [False]
        assert _dead("kin2:1:0")
        assert parents.execute_on(1).spawn("b").wait(timeout=120) == ["kin2:1"]
        (infos,) = parents.execute_on(1).kids_identity().wait(timeout=90)
        assert [i["tag"] for i in infos] == ["b", "b"]
        parents.shutdown()
        for name in ("kin2:0:0", "kin2:0:1", "kin2:1:0", "kin2:1:1"):
            assert _dead(name), name
