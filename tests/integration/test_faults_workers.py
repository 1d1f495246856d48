"""Fault injection with Ray workers: a worker raising or dying mid group call, a channel
worker killed. Real embedded Ray cluster on 127.0.0.1, real gloo between the workers.

Every case checks which call fails, with which error type and how long after the fault
(printed as ``FAULT-TIME`` lines, see :mod:`faults.harness`), and that the surviving
workers keep working with their other peers.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import ray.cloudpickle
import torch
from faults.harness import outcome, record_time

from p2p_worker import (
    ChannelClosedError,
    ChannelExistsError,
    Cluster,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Worker,
    WorkerError,
    create_channel,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

OP_TIMEOUT = 4.0  # the jobs' op_timeout: what a peer blocked on a failed worker waits
DEATH_BOUND = 10.0
SLACK = 5.0
JOB_CONFIG = {"cluster": {"collective": {"init_timeout": 60.0, "op_timeout": OP_TIMEOUT}}}


@pytest.fixture(scope="module")
def ray_base() -> Iterator[Any]:
    """An embedded Ray cluster on loopback for this module (or the process's running one)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("P2P_RAY_TMPDIR", tempfile.mkdtemp(prefix="p2pf", dir="/tmp"))
    # Ray workers cannot import this test module: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    base = Cluster(address="local")
    yield base
    base.shutdown()


@pytest.fixture
def cluster(ray_base: Any) -> Iterator[Any]:
    """A job of its own (store, config) on the module's Ray cluster."""
    c = Cluster(num_nodes=1, config=JOB_CONFIG)
    yield c
    c.shutdown()


class Ring(Worker):
    """Workers that pass messages around a ring and to chosen peers."""

    def __init__(self) -> None:
        super().__init__()
        self.last: str = "nothing yet"
        self.started = time.monotonic()

    def hello(self) -> int:
        return int(self._rank)

    def ring_round(self, fail_rank: int, exit_rank: int, nbytes: int) -> int:
        """Send to the next rank, receive from the previous one; fail or die on cue."""
        n = self._world_size
        nxt, prev = (self._rank + 1) % n, (self._rank - 1) % n
        group = self.worker_info.address.root_group_name
        try:
            sent = self.send(torch.full((nbytes // 4,), float(self._rank)), group, nxt, True)
            if self._rank == fail_rank:
                raise RuntimeError(f"injected failure on rank {self._rank} mid ring_round")
            if self._rank == exit_rank:
                time.sleep(0.2)
                os._exit(7)  # dies with its send possibly still on the wire
            got = self.recv(group, prev)
            sent.wait()
            self.last = "ok"
            return int(got[0])
        except Exception as exc:
            self.last = f"{type(exc).__name__} after {time.monotonic() - self.started:.2f} s"
            raise

    def start_clock(self) -> None:
        self.started = time.monotonic()

    def last_outcome(self) -> str:
        return self.last

    def pair(self, peer: int, first: bool) -> float:
        """Exchange one tensor with ``peer`` (``first`` sends before receiving)."""
        group = self.worker_info.address.root_group_name
        t = torch.full((1000,), float(self._rank))
        if first:
            self.send(t, group, peer)
            return float(self.recv(group, peer)[0])
        got = self.recv(group, peer)
        self.send(t, group, peer)
        return float(got[0])


def launch_ring(cluster: Any, name: str) -> Any:
    return Ring.create_group().launch(
        cluster, PackedPlacementStrategy(3, cpus_per_worker=0), name=name
    )


def pair(ring: Any, a: int, b: int) -> list[float]:
    """Ranks ``a`` and ``b`` exchange one tensor; return what each received."""
    first = ring.execute_on(a).pair(b, True)
    second = ring.execute_on(b).pair(a, False)
    return [first.wait(timeout=60)[0], second.wait(timeout=60)[0]]


def test_worker_raising_mid_group_call(cluster: Any) -> None:
    ring = launch_ring(cluster, "ring_raise")
    assert ring.ring_round(-1, -1, 4096).wait(timeout=120) == [2, 0, 1]  # all links up
    ring.start_clock().wait(timeout=60)
    t0 = time.monotonic()
    # 1 MiB: a send that completes only once the receiver takes it, over gloo and over
    # the same-node shared-memory link alike (a few KiB would sit in the socket buffer)
    handle = ring.ring_round(1, -1, 1 << 20)
    got = outcome(lambda: handle.wait(timeout=120), t0)
    record_time("worker raises mid group call", "GroupCallHandle.wait()", got.error, got.seconds)
    err = got.error
    assert isinstance(err, WorkerError), repr(err)
    assert (err.group_name, err.rank, err.method) == ("ring_raise", 1, "ring_round")
    assert err.remote_traceback is not None
    assert "injected failure on rank 1" in err.remote_traceback
    assert "ring_round" in err.remote_traceback
    assert isinstance(err.__cause__, RuntimeError)
    # reported at once, not after the peers' op timeouts
    assert got.seconds < DEATH_BOUND
    # rank 0 was sending to rank 1, which never received: its send hits the op timeout
    outcomes = ring.last_outcome().wait(timeout=60)
    assert outcomes[1].startswith("RuntimeError")
    assert outcomes[2] == "ok"  # rank 1 had sent before it raised
    assert outcomes[0].startswith("CollectiveTimeoutError"), outcomes
    seconds = float(outcomes[0].split(" after ")[1].split()[0])
    record_time("peer of a worker that raised", "Worker.send()", "CollectiveTimeoutError", seconds)
    assert seconds < OP_TIMEOUT + SLACK
    # every worker survives; the pairs that did not involve the failed call still talk
    assert ring.hello().wait(timeout=60) == [0, 1, 2]
    assert pair(ring, 2, 0) == [0.0, 2.0]
    assert pair(ring, 1, 2) == [2.0, 1.0]


def test_worker_dying_mid_group_call(cluster: Any) -> None:
    ring = launch_ring(cluster, "ring_exit")
    assert ring.ring_round(-1, -1, 4 << 20).wait(timeout=120) == [2, 0, 1]
    ring.start_clock().wait(timeout=60)
    t0 = time.monotonic()
    handle = ring.ring_round(-1, 1, 4 << 20)  # rank 1 dies after posting its send
    got = outcome(lambda: handle.wait(timeout=120), t0)
    record_time("worker dies mid group call", "GroupCallHandle.wait()", got.error, got.seconds)
    err = got.error
    assert isinstance(err, WorkerError), repr(err)
    assert err.group_name == "ring_exit"
    # the first failure seen is Ray's report of the death, or a peer's PeerError naming it
    if err.rank == 1:
        assert "died" in str(err)
    else:
        assert "PeerError" in str(err)
        assert "'ring_exit:1'" in str(err)
    assert got.seconds < DEATH_BOUND
    dead = outcome(lambda: ring.execute_on(1).hello().wait(timeout=60))
    assert isinstance(dead.error, WorkerError)
    assert "died" in str(dead.error)
    # its peers see the death: rank 2 receiving from it, rank 0 sending to it
    survivors = ring.execute_on(0, 2).last_outcome().wait(timeout=60)
    for text in survivors:
        if text != "ok":  # rank 2 may have received rank 1's message before it died
            assert text.startswith(("PeerError", "GroupBrokenError")), survivors
            assert float(text.split(" after ")[1].split()[0]) < DEATH_BOUND
    assert ring.execute_on(0, 2).hello().wait(timeout=60) == [0, 2]


def _channel_actor(name: str) -> Any:
    """The Ray actor of channel ``name``, found through Ray's public actor listing."""
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].endswith("/" + name):
            return ray.get_actor(entry["name"], namespace=entry["namespace"])
    raise AssertionError(f"no named actor for channel {name!r}")


class ChannelUser(Worker):
    """A worker that puts into a channel until the channel fails."""

    def put_until_error(self, name: str) -> tuple[str, int, float]:
        """Put until a put fails; return its error type, the count and the wall time."""
        ch = self.connect_channel(name, timeout=30)
        i = 0
        try:
            while True:
                ch.put({"i": i}, timeout=60)
                i += 1
        except Exception as exc:
            return type(exc).__name__, i, time.time()

    def talk(self, peer_group: str, first: bool) -> int:
        if first:
            self.send({"n": 1}, peer_group, 0)
            return int(self.recv(peer_group, 0)["n"])
        got = self.recv(peer_group, 0)
        self.send({"n": got["n"] + 1}, peer_group, 0)
        return int(got["n"])


def wait_until_full(ch: Any, timeout: float = 60.0) -> None:
    """Wait until the channel holds its maxsize items (the producer then waits for room)."""
    deadline = time.monotonic() + timeout
    while ch.stats()["held"] < ch.maxsize:
        assert time.monotonic() < deadline, ch.stats()
        time.sleep(0.05)


def test_channel_worker_killed(cluster: Any) -> None:
    one = NodePlacementStrategy([0], cpus_per_worker=0)
    producer = ChannelUser.create_group().launch(cluster, one, name="ch_producer")
    other = ChannelUser.create_group().launch(cluster, one, name="ch_other")
    ch = create_channel(cluster, "doomed", maxsize=2)
    putting = producer.put_until_error("doomed")  # fills the channel, then waits for room
    wait_until_full(ch)
    assert ch.get(timeout=30) == {"i": 0}  # the channel works
    pending_get = ch.get(async_op=True)  # gets item 1
    assert pending_get.wait(timeout=30) == {"i": 1}
    wait_until_full(ch)  # items 2 and 3 are in; the producer waits to put item 4
    waiting = create_channel(cluster, "doomed-empty").get(async_op=True)  # an empty channel
    killed_at = time.time()
    ray.kill(_channel_actor("doomed"))
    ray.kill(_channel_actor("doomed-empty"))
    t0 = time.monotonic()
    got = outcome(lambda: waiting.wait(timeout=60), t0)
    record_time("channel worker killed", "Channel.get() pending", got.error, got.seconds)
    assert isinstance(got.error, ChannelClosedError), repr(got.error)
    assert got.seconds < DEATH_BOUND
    put = outcome(lambda: ch.put("after", timeout=5))
    record_time("channel worker killed", "Channel.put() after", put.error, put.seconds)
    assert isinstance(put.error, ChannelClosedError), repr(put.error)
    assert put.seconds < DEATH_BOUND
    assert isinstance(outcome(lambda: ch.qsize(timeout=10)).error, ChannelClosedError)
    error, count, failed_at = putting.wait(timeout=120)[0]
    blocked = failed_at - killed_at
    record_time("channel worker killed", "Channel.put() waiting in a worker", error, blocked)
    # The waiting put sends nothing for a while: it must outlive this job's short
    # op_timeout (it once failed with ChannelError before the kill, under CI load,
    # when the idle receives of the channel's links ended at op_timeout).
    assert blocked >= 0, f"the waiting put failed before the kill ({error}, {count} put)"
    assert error == "ChannelClosedError"
    assert count == 4  # items 0..3 went in; the put of item 4 failed
    assert blocked < DEATH_BOUND
    # the workers keep talking to each other, and the name can be used again
    a = producer.talk("ch_other", True)
    b = other.talk("ch_producer", False)
    assert (a.wait(timeout=60), b.wait(timeout=60)) == ([2], [1])
    deadline = time.monotonic() + 30
    while True:
        try:
            again = create_channel(cluster, "doomed", maxsize=2)
            break
        except ChannelExistsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    again.put("fresh")
    assert again.get(timeout=30) == "fresh"
    again.destroy()
