"""Weight sync when a process dies mid-sync: real actors killed with ``ray.kill``.

Links are emulated at 8 Mbit/s so that a 4 MiB version takes seconds on the wire and
a kill lands in the middle of it. Without emulation the targets on the source's node
read its shared arena; there a target stopped with SIGSTOP holds the push up until it
is killed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch

from p2p_collective import PeerError
from p2p_worker import Cluster, PackedPlacementStrategy, WeightSyncError, Worker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

ONE = PackedPlacementStrategy(1, cpus_per_worker=0)
SLOW = {"cluster": {"net_emulation": {"bandwidth_mbps": 8.0, "delay_ms": 1.0}}}
BOUND = 10.0  # seconds from a kill to the error on the other side
NUMEL = 1 << 21  # 2 Mi values: 4 MiB of bf16
BUCKET = 256 << 10


def model(dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(NUMEL // 2, generator=g).to(dtype),
        "b": torch.randn(NUMEL // 2, generator=g).to(dtype),
    }


class Source(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = model(torch.float32, 1)
        self.work: Any = None

    def new_version(self, seed: int) -> None:
        self.model = model(torch.float32, seed)

    def push(self, version: int, targets: Any) -> dict[str, Any]:
        try:
            report = self.push_weights(
                self.model, version, targets, bucket_bytes=BUCKET, timeout=120, join_timeout=60
            )
        except WeightSyncError as exc:
            return {"failed": exc.failed, "targets": exc.report.targets}  # type: ignore[attr-defined]
        return {"failed": {}, "targets": report.targets}

    def expected(self) -> dict[str, torch.Tensor]:
        return {k: v.to(torch.bfloat16) for k, v in self.model.items()}


class Target(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = model(torch.bfloat16, 99)
        self.work: Any = None

    def start(self) -> None:
        self.work = self.pull_weights(self.model, "wf_src", 0, async_op=True, timeout=120)

    def progress(self) -> tuple[int, int]:
        receiver = self.weight_receiver()
        return (0, 0) if receiver is None else receiver.progress

    def finish(self) -> dict[str, Any]:
        try:
            return {"version": self.work.wait(timeout=120)}
        except WeightSyncError as exc:
            return {
                "error": str(exc),
                "peer_error": isinstance(exc.__cause__, PeerError),
                "torn": exc.torn,
                "held": self.weight_version(),
            }

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.items()}


@pytest.fixture
def slow(ray_session: object) -> Iterator[Cluster]:
    with Cluster(num_nodes=1, config=SLOW) as c:
        yield c


def wait_progress(target: Any, at_least: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, _ = target.progress().wait(30)[0]
        if done >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError("the sync did not start")


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


def test_source_killed_mid_sync_targets_fail_fast_and_keep_what_they_can_prove(
    slow: Cluster,
) -> None:
    src = Source.create_group().launch(slow, ONE, name="wf_src")
    targets = [Target.create_group().launch(slow, ONE, name=f"wf_t{i}") for i in range(2)]
    names = [("wf_t0", 0), ("wf_t1", 0)]
    for t in targets:
        t.start().wait(30)
    assert src.push(1, names).wait(120) == [{"failed": {}, "targets": {"wf_t0:0": 1, "wf_t1:0": 1}}]
    v1 = src.expected().wait(30)[0]
    assert [t.finish().wait(60)[0] for t in targets] == [{"version": 1}, {"version": 1}]
    src.new_version(2).wait(30)
    for t in targets:
        t.start().wait(30)
    src.push(2, names)
    wait_progress(targets[0], 2)
    ray.kill(src.actors[0], no_restart=True)
    killed = time.monotonic()
    outcomes = [t.finish().wait(60)[0] for t in targets]
    assert time.monotonic() - killed < BOUND
    for got, t in zip(outcomes, targets, strict=True):
        assert "error" in got, got
        assert got["peer_error"], got
        assert "version 2" in got["error"]
        if got["held"] is None:
            assert got["torn"]
        else:  # it says it holds version 1: it must, bit for bit
            assert got["held"] == 1
            assert same(v1, t.state().wait(30)[0])


def test_target_killed_mid_sync_others_finish_and_a_restarted_one_catches_up(
    slow: Cluster,
) -> None:
    src = Source.create_group().launch(slow, ONE, name="wf_src")
    targets = [Target.create_group().launch(slow, ONE, name=f"wf_t{i}") for i in range(3)]
    names = [(f"wf_t{i}", 0) for i in range(3)]
    for t in targets:
        t.start().wait(30)
    got = src.push(1, names).wait(120)[0]
    assert got["failed"] == {}
    for t in targets:
        assert t.finish().wait(60)[0] == {"version": 1}
    # version 2: the middle of the chain dies half way
    src.new_version(2).wait(30)
    for t in targets:
        t.start().wait(30)
    pushed = src.push(2, names)
    wait_progress(targets[1], 2)
    ray.kill(targets[1].actors[0], no_restart=True)
    killed = time.monotonic()
    report = pushed.wait(120)[0]
    assert time.monotonic() - killed < BOUND + 20  # the last target's resend included
    assert list(report["failed"]) == ["wf_t1:0"]
    assert report["targets"]["wf_t0:0"] == 2
    assert report["targets"]["wf_t2:0"] == 2
    v2 = src.expected().wait(30)[0]
    for i in (0, 2):
        assert targets[i].finish().wait(60)[0] == {"version": 2}
        assert same(v2, targets[i].state().wait(30)[0])
    # a new process under the dead one's address joins the next sync; nobody rebuilds groups
    targets[1].shutdown()
    targets[1] = Target.create_group().launch(slow, ONE, name="wf_t1")
    src.new_version(3).wait(30)
    for t in targets:
        t.start().wait(30)
    report = src.push(3, names).wait(120)[0]
    assert report["failed"] == {}
    v3 = src.expected().wait(30)[0]
    for t in targets:
        assert t.finish().wait(60)[0] == {"version": 3}
        assert same(v3, t.state().wait(30)[0])


class Stoppable(Target):
    def pid(self) -> int:
        return os.getpid()


def test_lent_targets_a_stalled_then_killed_reader_or_a_killed_source_fail_in_seconds(
    cluster: Cluster,
) -> None:
    """Targets on the source's node read its arena; one stops reading (SIGSTOP), then dies.

    The source cannot reuse a region that reader still holds, so the push stalls until
    the death frees it; the other targets then finish exactly. Later the source itself
    dies while a stopped reader stalls the push: the others fail fast and keep what
    they can prove.
    """
    src = Source.create_group().launch(cluster, ONE, name="wf_src")
    targets = [Stoppable.create_group().launch(cluster, ONE, name=f"wf_t{i}") for i in range(3)]
    names = [(f"wf_t{i}", 0) for i in range(3)]
    for t in targets:
        t.start().wait(30)
    assert src.push(1, names).wait(120)[0]["failed"] == {}
    for t in targets:
        assert t.finish().wait(60)[0] == {"version": 1}
    # version 2: wf_t1 says hello, then stops; the push stalls on it until it is killed
    src.new_version(2).wait(30)
    for t in targets:
        t.start().wait(30)
    stopped = targets[1].pid().wait(30)[0]
    os.kill(stopped, signal.SIGSTOP)
    pushed = src.push(2, names)
    wait_progress(targets[0], 1)
    time.sleep(1.0)
    assert targets[0].progress().wait(30)[0][0] < 16  # stalled: 16 buckets in all
    os.kill(stopped, signal.SIGKILL)
    killed = time.monotonic()
    report = pushed.wait(120)[0]
    assert time.monotonic() - killed < BOUND
    assert list(report["failed"]) == ["wf_t1:0"]
    v2 = src.expected().wait(30)[0]
    for i in (0, 2):
        assert targets[i].finish().wait(60)[0] == {"version": 2}
        assert same(v2, targets[i].state().wait(30)[0])
    # a new wf_t1 catches up; then it stops, and the source dies mid-push
    targets[1].shutdown()
    targets[1] = Stoppable.create_group().launch(cluster, ONE, name="wf_t1")
    src.new_version(3).wait(30)
    for t in targets:
        t.start().wait(30)
    assert src.push(3, names).wait(120)[0]["failed"] == {}
    for t in targets:
        assert t.finish().wait(60)[0] == {"version": 3}
    v3 = src.expected().wait(30)[0]
    src.new_version(4).wait(30)
    for t in targets:
        t.start().wait(30)
    stopped = targets[1].pid().wait(30)[0]
    os.kill(stopped, signal.SIGSTOP)
    src.push(4, names)
    wait_progress(targets[0], 1)
    ray.kill(src.actors[0], no_restart=True)
    killed = time.monotonic()
    outcomes = [targets[i].finish().wait(60)[0] for i in (0, 2)]
    assert time.monotonic() - killed < BOUND
    os.kill(stopped, signal.SIGKILL)
    for got, i in zip(outcomes, (0, 2), strict=True):
        assert got["peer_error"], got
        assert "version 4" in got["error"]
        if got["held"] is None:
            assert got["torn"]
        else:
            assert got["held"] == 3
            assert same(v3, targets[i].state().wait(30)[0])
