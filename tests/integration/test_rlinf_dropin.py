"""Code written for RLinf's scheduler, run on p2p-worker with only its import changed.

The workers and checks below are written the way RLinf's own communication tests are
(``from rlinf.scheduler import ...`` becomes ``from p2p_worker import ...``): a sender
and a receiver group of CPU workers each (4; RLinf's use 8), all on node 0 with RLinf's default
resources, paired in a ring (sender ``r`` sends to receiver ``r + 1``); every payload
kind (module-level dataclasses included) sync, with ``async_op=True`` and from
``async def`` methods awaited on the actor's event loop; RLinf's ``broadcast`` form
across both groups; ``CollectiveGroupOptions`` passed through; keyed and weighted
channels from workers and from the driver. One cluster and one pair of groups serve
the whole module, so the module runs in well under a minute on two cores.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray
import torch

from p2p_worker import (
    Channel,
    Cluster,
    CollectiveGroupOptions,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Worker,
    WorkerAddress,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SENDER_GROUP_NAME = "sender_worker_group"
RECEIVER_GROUP_NAME = "receiver_worker_group"
GROUP_SIZE = 4  # RLinf's tests use 8; 4 keeps the ring and halves the process starts
OPTIONS = CollectiveGroupOptions(accel_max_ctas=1)


def accelerator_is_available() -> bool:
    """What RLinf code asks the Worker class (read at class level, before any launch)."""
    platform = Worker.torch_platform
    return platform is not None and platform.is_available()


def send_peer(rank: int, world_size: int) -> int:
    return (rank + 1) % world_size


def recv_peer(rank: int, world_size: int) -> int:
    return (rank - 1) % world_size


@dataclass
class TensorMessage:
    id: int
    payload: torch.Tensor
    note: str


@dataclass
class TensorListMessage:
    id: int
    payload_list: list[torch.Tensor]
    note: str


@dataclass
class TensorDictMessage:
    id: int
    payload_dict: dict[str, torch.Tensor]
    note: str


@dataclass
class PlainMessage:
    id: int
    name: str
    value: float


def make_payload(kind: str, rank: int) -> Any:
    """One payload of each kind RLinf tests move, with values that name the sender."""
    t = torch.ones(2, 2) * rank
    payloads: dict[str, Any] = {
        "object": {"message": f"Hello from rank {rank}"},
        "plain_dataclass": PlainMessage(rank, f"rank_{rank}", 3.14 * (rank + 1)),
        "tensor": t,
        "tensor_list": [torch.ones(2, 2) * i + rank for i in range(4)],
        "tensor_tuple": (t, torch.arange(3) + rank),
        "tensor_dict": {f"t{i}": torch.ones(2, 2) * i + rank for i in range(4)},
        "tensor_dataclass": TensorMessage(rank, t, f"from rank {rank}"),
        "tensor_list_dataclass": TensorListMessage(
            rank, [t + i for i in range(3)], f"list from rank {rank}"
        ),
        "tensor_dict_dataclass": TensorDictMessage(
            rank, {f"k{i}": t + i for i in range(3)}, f"dict from rank {rank}"
        ),
        # Large and compressible: takes the lz4 path the job configures.
        "compressed": {"zeros": torch.zeros(256 * 1024, dtype=torch.uint8) + rank % 2},
    }
    return payloads[kind]


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert torch.equal(got, want)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, dict):
        assert isinstance(got, dict)
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif hasattr(want, "__dataclass_fields__"):
        assert type(got) is type(want)
        for name in want.__dataclass_fields__:
            assert_same(getattr(got, name), getattr(want, name))
    else:
        assert got == want


PAYLOAD_KINDS = [
    "object",
    "plain_dataclass",
    "tensor",
    "tensor_list",
    "tensor_tuple",
    "tensor_dict",
    "tensor_dataclass",
    "tensor_list_dataclass",
    "tensor_dict_dataclass",
    "compressed",
]


class SenderWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        # RLinf's tests pick the device here; these CPU workers read the same names.
        self.on_accelerator = accelerator_is_available() and bool(self.worker_info.available_gpus)

    def send_payload(self, kind: str, async_op: bool = False) -> bool:
        peer = send_peer(self._rank, self._world_size)
        work = self.send(
            make_payload(kind, self._rank),
            RECEIVER_GROUP_NAME,
            peer,
            async_op=async_op,
            options=OPTIONS,
        )
        if async_op:
            work.wait()
        return True

    async def send_payload_asyncio(self, kind: str) -> bool:
        peer = send_peer(self._rank, self._world_size)
        work = self.send(make_payload(kind, self._rank), RECEIVER_GROUP_NAME, peer, async_op=True)
        await work.async_wait()
        return True

    def send_tensor_inplace(self, async_op: bool = False) -> bool:
        peer = send_peer(self._rank, self._world_size)
        work = self.send_tensor(
            torch.ones(3, 3) * self._rank, RECEIVER_GROUP_NAME, peer, async_op=async_op
        )
        if async_op:
            work.wait()
        return True

    def consecutive(self, n: int) -> None:
        peer = send_peer(self._rank, self._world_size)
        out = torch.ones(5, 5) * self._rank
        works = []
        for _ in range(n):
            works.append(self.send(out, RECEIVER_GROUP_NAME, peer, async_op=True))
            works.append(self.send_tensor(out, RECEIVER_GROUP_NAME, peer, async_op=True))
        for w in works:
            w.wait()

    def options_toward_peer(self) -> CollectiveGroupOptions | None:
        return self.collective_options(RECEIVER_GROUP_NAME, send_peer(self._rank, self._world_size))

    def bad_options(self) -> str:
        peer = send_peer(self._rank, self._world_size)
        try:
            self.send("never sent", RECEIVER_GROUP_NAME, peer, options={"accel_max_ctas": 1})
        except TypeError as exc:
            return str(exc)
        return "accepted"

    def broadcast_rlinf(self, src: tuple[str, int] | None, async_op: bool) -> Any:
        return broadcast_in(self, src, async_op)

    async def broadcast_asyncio(self) -> Any:
        return await broadcast_awaited(self)

    def produce(self, channel: Channel, n: int, async_op: bool = False) -> bool:
        """Put n items for the next receiver, under its key, with weights 1, 2, 1, 2, ..."""
        key = f"to{send_peer(self._rank, self._world_size)}"
        works = [
            channel.put(item_for(self._rank, i), weight=1 + i % 2, key=key, async_op=async_op)
            for i in range(n)
        ]
        for w in works if async_op else []:
            w.wait()
        return True

    async def produce_asyncio(self, channel: Channel, n: int) -> bool:
        key = f"to{send_peer(self._rank, self._world_size)}"
        for i in range(n):
            await channel.put(item_for(self._rank, i), key=key, async_op=True).async_wait()
        return True

    def create_named_channel(self, name: str) -> int:
        channel = self.create_channel(channel_name=name, maxsize=4, node_rank=0)
        channel.put(f"hello from {self._rank}", key="greeting", weight=2)
        return channel.maxsize


class ReceiverWorker(Worker):
    def recv_payload(self, async_op: bool = False) -> Any:
        peer = recv_peer(self._rank, self._world_size)
        work = self.recv(SENDER_GROUP_NAME, peer, async_op=async_op, options=OPTIONS)
        return work.wait() if async_op else work

    async def recv_payload_asyncio(self) -> Any:
        peer = recv_peer(self._rank, self._world_size)
        return await self.recv(SENDER_GROUP_NAME, peer, async_op=True).async_wait()

    def recv_tensor_inplace(self, async_op: bool = False) -> torch.Tensor:
        peer = recv_peer(self._rank, self._world_size)
        buf = torch.empty(3, 3)
        work = self.recv_tensor(buf, SENDER_GROUP_NAME, peer, async_op=async_op)
        if async_op:
            work.wait()
        return buf

    def consecutive(self, n: int) -> torch.Tensor:
        peer = recv_peer(self._rank, self._world_size)
        buf = torch.zeros(5, 5)
        works = []
        for _ in range(n):
            works.append(self.recv(SENDER_GROUP_NAME, peer, async_op=True))
            works.append(self.recv_tensor(buf, SENDER_GROUP_NAME, peer, async_op=True))
        got = [w.wait() for w in works]
        assert all(torch.equal(g, got[0]) for g in got[0::2])
        return buf

    async def recv_while_yielding(self) -> tuple[int, Any]:
        """The event loop keeps running other tasks while a receive is awaited."""
        peer = recv_peer(self._rank, self._world_size)
        task = asyncio.create_task(self.recv(SENDER_GROUP_NAME, peer, async_op=True).async_wait())
        ticks = 0
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.01)
        return ticks, task.result()

    def broadcast_rlinf(self, src: tuple[str, int] | None, async_op: bool) -> Any:
        return broadcast_in(self, src, async_op)

    async def broadcast_asyncio(self) -> Any:
        return await broadcast_awaited(self)

    def consume(self, channel: Channel, n: int, async_op: bool = False) -> list[Any]:
        key = f"to{self._rank}"
        if async_op:
            return [w.wait() for w in [channel.get(key=key, async_op=True) for _ in range(n)]]
        return [channel.get(key=key) for _ in range(n)]

    def consume_batch(self, channel: Channel, target_weight: int) -> list[Any]:
        return channel.get_batch(target_weight=target_weight, key=f"to{self._rank}")

    async def consume_asyncio(self, channel: Channel, n: int) -> list[Any]:
        key = f"to{self._rank}"
        return [await channel.get(key=key, async_op=True).async_wait() for _ in range(n)]

    def greeting(self, name: str) -> tuple[Any, int]:
        channel = self.connect_channel(name)
        return channel.get(key="greeting"), channel.qsize(key="greeting")


def item_for(rank: int, i: int) -> Any:
    return TensorMessage(i, torch.full((2,), float(rank)), f"item {i} of rank {rank}")


ALL_GROUPS = [
    (SENDER_GROUP_NAME, list(range(GROUP_SIZE))),
    (RECEIVER_GROUP_NAME, list(range(GROUP_SIZE))),
]


def broadcast_in(worker: Worker, src: tuple[str, int] | None, async_op: bool) -> Any:
    source = WorkerAddress(*src) if src is not None else WorkerAddress(SENDER_GROUP_NAME, 0)
    is_src = worker._worker_address == source  # what RLinf code compares
    payload = TensorMessage(13, torch.ones(2, 2) * 13, "broadcast") if is_src else None
    result = worker.broadcast(payload, groups=ALL_GROUPS, src=src, async_op=async_op)
    return result.wait() if async_op else result


async def broadcast_awaited(worker: Worker) -> Any:
    payload = torch.ones(3, 3) * 5 if worker._worker_address.rank == 0 else None
    if worker._group_name != SENDER_GROUP_NAME:
        payload = None
    work = worker.broadcast(payload, groups=ALL_GROUPS, async_op=True, options=OPTIONS)
    await work.async_wait()
    return work.wait()


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One job for the module, configured the way RLinf's tests configure theirs."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("P2P_RAY_TMPDIR", tempfile.mkdtemp(prefix="p2pr", dir="/tmp"))
    # No by-value pickling of this module: its dataclasses travel by reference, as in a
    # user's program; workers import it because the Cluster gives them the driver's path.
    c = Cluster(
        cluster_cfg={
            "num_nodes": 1,
            "component_placement": [],
            "collective": {
                "tensor_compression": {
                    "enabled": True,
                    "codec": "lz4",
                    "min_bytes": 1024,
                    "acceleration": 1,
                }
            },
        }
    )
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def worker_groups(cluster: Cluster) -> Iterator[tuple[Any, Any]]:
    """RLinf's CPU layout (senders and receivers on node 0, default resources), 4 + 4."""
    assert cluster.num_accelerators == 0 or cluster.num_accelerators >= 1
    placement = NodePlacementStrategy([0] * GROUP_SIZE)
    senders = SenderWorker.create_group().launch(
        cluster=cluster, placement_strategy=placement, name=SENDER_GROUP_NAME
    )
    receivers = ReceiverWorker.create_group().launch(
        cluster=cluster, placement_strategy=placement, name=RECEIVER_GROUP_NAME
    )
    yield senders, receivers
    senders.shutdown()  # RLinf's tests call the private _close(); this is the public one
    receivers.shutdown()


def run_pair(groups: tuple[Any, Any], send: str, recv: str, sargs: tuple, rargs: tuple) -> list:
    senders, receivers = groups
    s = getattr(senders, send)(*sargs)
    r = getattr(receivers, recv)(*rargs)
    assert s.wait(timeout=120) == [True] * GROUP_SIZE
    return r.wait(timeout=120)


# --- tests ----------------------------------------------------------------------------


def test_rlinf_names_on_the_driver(cluster: Cluster, worker_groups: tuple[Any, Any]) -> None:
    senders, _ = worker_groups
    assert Worker.torch_device_type in (None, "cuda")
    assert accelerator_is_available() == (Worker.torch_device_type == "cuda")
    assert (Worker.torch_platform is None) == (Worker.torch_device_type is None)
    assert cluster.num_accelerators == cluster.num_gpus
    entries = senders.worker_info_list
    assert [e.rank for e in entries] == list(range(GROUP_SIZE))
    assert senders.worker_group_name == SENDER_GROUP_NAME
    assert all(e.info.node_id == 0 for e in entries)
    # The actor handles RLinf code keeps are plain Ray actors of the worker class.
    assert ray.get(entries[3].worker.options_toward_peer.remote()) in (None, OPTIONS)


@pytest.mark.parametrize("kind", PAYLOAD_KINDS)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async_wait"])
def test_payload_ring(worker_groups: tuple[Any, Any], kind: str, async_op: bool) -> None:
    results = run_pair(worker_groups, "send_payload", "recv_payload", (kind, async_op), (async_op,))
    for rank, got in enumerate(results):
        assert_same(got, make_payload(kind, recv_peer(rank, GROUP_SIZE)))


@pytest.mark.parametrize(
    "kind", ["tensor", "tensor_dataclass", "tensor_list_dataclass", "tensor_dict_dataclass"]
)
def test_payload_ring_asyncio(worker_groups: tuple[Any, Any], kind: str) -> None:
    senders, receivers = worker_groups
    s = senders.send_payload_asyncio(kind)
    r = receivers.recv_payload_asyncio()
    # An async method's group call returns the same handle type as a sync one's.
    assert type(s) is type(senders.execute_on(0).options_toward_peer())
    assert s.wait(timeout=120) == [True] * GROUP_SIZE
    for rank, got in enumerate(r.wait(timeout=120)):
        assert_same(got, make_payload(kind, recv_peer(rank, GROUP_SIZE)))


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async_wait"])
def test_send_tensor_inplace_ring(worker_groups: tuple[Any, Any], async_op: bool) -> None:
    results = run_pair(
        worker_groups, "send_tensor_inplace", "recv_tensor_inplace", (async_op,), (async_op,)
    )
    for rank, got in enumerate(results):
        assert torch.equal(got, torch.ones(3, 3) * recv_peer(rank, GROUP_SIZE))


def test_consecutive_async_ops_keep_order(worker_groups: tuple[Any, Any]) -> None:
    senders, receivers = worker_groups
    s, r = senders.consecutive(50), receivers.consecutive(50)
    s.wait(timeout=120)
    for rank, got in enumerate(r.wait(timeout=120)):
        assert torch.equal(got, torch.ones(5, 5) * recv_peer(rank, GROUP_SIZE))


def test_async_wait_yields_to_the_event_loop(worker_groups: tuple[Any, Any]) -> None:
    senders, receivers = worker_groups
    r = receivers.recv_while_yielding()
    s = senders.send_payload("object")
    s.wait(timeout=120)
    for rank, (ticks, got) in enumerate(r.wait(timeout=120)):
        assert ticks >= 1
        assert got == make_payload("object", recv_peer(rank, GROUP_SIZE))


def test_options_pass_through_and_bad_options_leave_the_pair_usable(
    worker_groups: tuple[Any, Any],
) -> None:
    senders, _receivers = worker_groups
    run_pair(worker_groups, "send_payload", "recv_payload", ("object", False), (False,))
    assert senders.options_toward_peer().wait() == [OPTIONS] * GROUP_SIZE
    for message in senders.bad_options().wait(timeout=60):
        assert "options must be a CollectiveGroupOptions" in message
    with pytest.raises(ValueError, match="accel_min_ctas=4 exceeds accel_max_ctas=2"):
        CollectiveGroupOptions(accel_max_ctas=2, accel_min_ctas=4)
    results = run_pair(worker_groups, "send_payload", "recv_payload", ("tensor", True), (True,))
    assert torch.equal(results[0], torch.ones(2, 2) * (GROUP_SIZE - 1))


@pytest.mark.parametrize(
    "src", [None, (RECEIVER_GROUP_NAME, GROUP_SIZE - 1)], ids=["first_member", "explicit_src"]
)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async_wait"])
def test_rlinf_broadcast_across_groups(
    worker_groups: tuple[Any, Any], src: tuple[str, int] | None, async_op: bool
) -> None:
    senders, receivers = worker_groups
    s = senders.broadcast_rlinf(src, async_op)
    r = receivers.broadcast_rlinf(src, async_op)
    want = TensorMessage(13, torch.ones(2, 2) * 13, "broadcast")
    for got in s.wait(timeout=120) + r.wait(timeout=120):
        assert_same(got, want)


def test_rlinf_broadcast_asyncio(worker_groups: tuple[Any, Any]) -> None:
    senders, receivers = worker_groups
    s, r = senders.broadcast_asyncio(), receivers.broadcast_asyncio()
    for got in s.wait(timeout=120) + r.wait(timeout=120):
        assert torch.equal(got, torch.ones(3, 3) * 5)


def test_rlinf_packed_placement_form(cluster: Cluster) -> None:
    """RLinf's PackedPlacementStrategy(start, end): on CPU-only nodes, ranks are nodes."""
    strategy = PackedPlacementStrategy(start_hardware_rank=0, end_hardware_rank=0)
    group = ReceiverWorker.create_group().launch(
        cluster=cluster, placement_strategy=strategy, name="packed_placement"
    )
    try:
        assert [e.info.node_id for e in group.worker_info_list] == [0]
    finally:
        group.shutdown()


# --- channels --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def channel(cluster: Cluster, worker_groups: tuple[Any, Any]) -> Iterator[Channel]:
    """RLinf's recommended practice: create the channel in the driver, pass it to workers."""
    ch = Channel.create(name="rlinf_channel")
    yield ch
    ch.destroy()


def eventually_zero(read: Any, within: float) -> int:
    """Poll ``read()`` until it returns 0 or ``within`` seconds pass; the last value."""
    deadline = time.monotonic() + within
    value = read()
    while value != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return int(value)


def check_items(items: list[Any], rank: int, n: int) -> None:
    src = recv_peer(rank, GROUP_SIZE)
    assert [m.id for m in items] == list(range(n))  # per-key FIFO
    for m in items:
        assert_same(m, item_for(src, m.id))


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async_wait"])
def test_keyed_channel_between_workers(
    worker_groups: tuple[Any, Any], channel: Channel, async_op: bool
) -> None:
    senders, receivers = worker_groups
    consumed = receivers.consume(channel, 4, async_op)
    assert senders.produce(channel, 4, async_op).wait(timeout=120) == [True] * GROUP_SIZE
    for rank, items in enumerate(consumed.wait(timeout=120)):
        check_items(items, rank, 4)
    # Every item was consumed; the default key's qsize also counts slots granted to a
    # producer whose payload has not come (an async put that went out on a lent credit
    # instead hands its reservation back once the producer is idle), so it settles to 0.
    assert eventually_zero(channel.qsize, within=10.0) == 0


def test_keyed_channel_asyncio(worker_groups: tuple[Any, Any], channel: Channel) -> None:
    senders, receivers = worker_groups
    consumed = receivers.consume_asyncio(channel, 3)
    assert senders.produce_asyncio(channel, 3).wait(timeout=120) == [True] * GROUP_SIZE
    for rank, items in enumerate(consumed.wait(timeout=120)):
        check_items(items, rank, 3)


def test_get_batch_fills_to_target_weight(worker_groups: tuple[Any, Any], channel: Channel) -> None:
    senders, receivers = worker_groups
    # Weights go 1, 2, 1, 2: a target of 3 takes two items, the next two again.
    batches = receivers.consume_batch(channel, 3)
    senders.produce(channel, 4).wait(timeout=120)
    for rank, items in enumerate(batches.wait(timeout=120)):
        check_items(items, rank, 2)
    for rank, items in enumerate(receivers.consume_batch(channel, 3).wait(timeout=120)):
        assert [m.id for m in items] == [2, 3]
        assert_same(items[0], item_for(recv_peer(rank, GROUP_SIZE), 2))


def test_driver_puts_and_gets_with_keys_and_weights(channel: Channel) -> None:
    # The workers of the tests before may still hold put credits for a moment, and with
    # them a granted slot the default key's qsize counts (see Channel.qsize): let them
    # hand those back first, so the counts below are this test's own.
    assert eventually_zero(lambda: channel.stats()["arriving"], within=10.0) == 0
    for i in range(5):
        channel.put({"i": i, "x": torch.arange(3) * i}, weight=2, key=("driver", 7))
    channel.put("unkeyed")
    assert channel.qsize(key=("driver", 7)) == 5
    assert channel.qsize() == 1
    batch = channel.get_batch(target_weight=4, key=("driver", 7))
    assert [b["i"] for b in batch] == [0, 1]
    assert torch.equal(batch[1]["x"], torch.arange(3))
    assert channel.get(key=("driver", 7), async_op=True).wait(timeout=60)["i"] == 2
    assert channel.get_batch(max_items=10, key=("driver", 7))[-1]["i"] == 4  # our form
    assert channel.get() == "unkeyed"
    assert channel.empty(key=("driver", 7))
    with pytest.raises(TypeError, match="hashable"):
        channel.put("x", key=["unhashable"])
    with pytest.raises(ValueError, match="weight must be >= 0"):
        channel.put("x", weight=-1)
    channel.put("still usable", key="after")
    assert channel.get(key="after") == "still usable"


def test_worker_created_channel_and_rlinf_names(worker_groups: tuple[Any, Any]) -> None:
    senders, receivers = worker_groups
    assert senders.execute_on(0).create_named_channel("made_by_worker").wait(timeout=60) == [4]
    got = receivers.execute_on(2).greeting("made_by_worker").wait(timeout=60)
    assert got == [("hello from 0", 0)]
    again = Channel.create(name="made_by_worker")  # exists: RLinf connects to it
    assert again.maxsize == 4
    again.destroy()
