"""Channels on a real embedded Ray cluster: workers and the driver, items of every kind."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from channel_helpers import settled

from p2p_asyncwork import AsyncChannelWork, WorkCancelledError
from p2p_worker import (
    Channel,
    ChannelClosedError,
    ChannelEmpty,
    ChannelError,
    ChannelExistsError,
    ChannelFull,
    ChannelNotFoundError,
    Cluster,
    NodePlacementStrategy,
    Worker,
    WorkerError,
    connect_channel,
    create_channel,
)
from p2p_worker._channels._protocol.proto import CHANNEL_NAMESPACE

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)


def sample_items() -> list[Any]:
    # Items are unpickled in the channel worker too, so every class in them must be
    # importable there; a class defined in this test module is not.
    return [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        {"obs": torch.ones(5), "mask": torch.tensor([True, False])},
        [torch.zeros(3, dtype=torch.int64), torch.full((2,), 7, dtype=torch.int16)],
        {"step": 3, "text": "plain dict", "nested": {"a": [1, 2]}},
        ("tuple", 1, 2.5),
        None,
        torch.empty(0),
    ]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


class Peer(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.channels: dict[str, Channel] = {}

    def create(self, name: str, maxsize: int = 0, transfer_timeout: float = 60.0) -> str:
        ch = self.create_channel(name, maxsize=maxsize, transfer_timeout=transfer_timeout)
        self.channels[name] = ch
        return ch.name

    def put_all(self, name: str, items: list[Any]) -> int:
        ch = self.connect_channel(name)
        for item in items:
            ch.put(item)
        return len(items)

    def get_n(self, name: str, n: int, timeout: float | None = None) -> list[Any]:
        ch = self.connect_channel(name)
        return [ch.get(timeout=timeout) for _ in range(n)]

    def put_async_probe(self, name: str, item: Any, wait_s: float) -> dict[str, Any]:
        """Start an async put on a full channel; report whether it completed within wait_s."""
        ch = self.connect_channel(name)
        work = ch.put(item, async_op=True)
        time.sleep(wait_s)
        done_early = work.done()
        self.pending = work
        return {"done_early": done_early, "is_channel_work": isinstance(work, AsyncChannelWork)}

    def finish_pending(self, timeout: float) -> bool:
        self.pending.wait(timeout)
        return True

    def take_from(self, channel: Channel, n: int) -> list[Any]:
        """Use a handle that was pickled and sent here."""
        return [channel.get(timeout=60) for _ in range(n)]

    def block_on_get(self, name: str) -> Any:
        return self.connect_channel(name).get()


@pytest.fixture(scope="module")
def cluster(ray_session: object) -> Iterator[Cluster]:
    """One job for the whole module (no test here kills a process): its store and workers
    serve every test, and each test's channels are destroyed after it (``fresh_channels``)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = Cluster(num_nodes=1)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def peers(cluster: Cluster) -> tuple[Any, Any]:
    a = Peer.create_group().launch(cluster, ONE, name="ch_a")
    b = Peer.create_group().launch(cluster, ONE, name="ch_b")
    return a, b


def channel_actors() -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == CHANNEL_NAMESPACE
    }


@pytest.fixture(autouse=True)
def fresh_channels(cluster: Cluster) -> Iterator[None]:
    """Destroy the channels a test created (their workers would pile up in the shared job)."""
    before = channel_actors()
    yield
    for full in channel_actors() - before:
        name = full.rsplit("/", 1)[1]
        with contextlib.suppress(ChannelNotFoundError, ChannelClosedError):
            connect_channel(cluster, name, timeout=5.0).destroy(timeout=10.0)


def test_items_of_every_kind_between_workers(peers: tuple[Any, Any]) -> None:
    a, b = peers
    assert a.create("kinds", 3).wait() == ["kinds"]
    items = sample_items()
    getting = b.get_n("kinds", len(items), 60.0)
    assert a.put_all("kinds", items).wait() == [len(items)]
    got = getting.wait(120)[0]
    assert len(got) == len(items)
    for want, have in zip(items, got, strict=True):
        assert same(want, have), (want, have)


def test_driver_creates_and_workers_use(cluster: Cluster, peers: tuple[Any, Any]) -> None:
    a, b = peers
    ch = create_channel(cluster, "from_driver", maxsize=4)
    assert ch.maxsize == 4
    assert connect_channel(cluster, "from_driver") is ch
    ch.put({"x": torch.ones(3)})
    ch.put("second")
    assert ch.qsize() == 2
    got = b.get_n("from_driver", 2, 30.0).wait()[0]
    assert same(got[0], {"x": torch.ones(3)})
    assert got[1] == "second"
    # Workers to the driver, through the same channel.
    assert a.put_all("from_driver", [1, 2, 3]).wait() == [3]
    assert ch.get_batch(max_items=10) == [1, 2, 3]
    assert ch.empty()
    ch.destroy()


def test_worker_creates_and_driver_connects(cluster: Cluster, peers: tuple[Any, Any]) -> None:
    a, _ = peers
    a.create("from_worker", 0).wait()
    ch = connect_channel(cluster, "from_worker", timeout=10)
    assert a.put_all("from_worker", [torch.full((2,), float(i)) for i in range(5)]).wait()
    got = [ch.get(timeout=30) for _ in range(5)]
    assert [float(t[0]) for t in got] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_nowait_errors_sizes_and_batches_from_the_driver(cluster: Cluster) -> None:
    ch = create_channel(cluster, "nowait", maxsize=2)
    with pytest.raises(ChannelEmpty):
        ch.get_nowait()
    ch.put_nowait("a")
    ch.put(torch.zeros(1000))  # 4000 tensor bytes
    assert ch.full()
    assert ch.qsize() == 2
    with pytest.raises(ChannelFull):
        ch.put_nowait("c")
    t0 = time.monotonic()
    with pytest.raises(ChannelFull):
        ch.put("c", timeout=0.3)
    assert time.monotonic() - t0 >= 0.25
    st = ch.stats()
    assert (st["held"], st["queued"] + st["arriving"], st["maxsize"]) == (2, 2, 2)
    assert ch.get_nowait() == "a"
    assert torch.equal(ch.get(), torch.zeros(1000))
    with pytest.raises(ChannelEmpty):
        ch.get(timeout=0.2)
    ch.put(0, timeout=5)
    ch.put(1, timeout=5)
    assert ch.get_batch(max_items=5) == [0, 1]
    # Batches by bytes: the first item always, further ones while the total fits.
    big = create_channel(cluster, "bytes", maxsize=0)
    for _ in range(4):
        big.put(torch.zeros(256, dtype=torch.uint8))
    assert len(big.get_batch(max_items=10, max_bytes=600)) == 2
    assert len(big.get_batch(max_items=1, max_bytes=1)) == 1
    assert len(big.get_batch(max_items=10)) == 1
    assert settled(big)["held"] == 0


def test_async_handles_and_asyncio(cluster: Cluster) -> None:
    ch = create_channel(cluster, "asyncs", maxsize=1)
    first = ch.put("one", async_op=True)
    assert isinstance(first, AsyncChannelWork)
    first.wait(30)
    second = ch.put("two", async_op=True)  # full: stays pending
    time.sleep(0.5)
    assert not second.done()
    got = ch.get(async_op=True)
    assert got.wait(30) == "one"
    second.wait(30)

    async def consume() -> Any:
        return await ch.get(async_op=True)

    assert asyncio.run(consume()) == "two"
    chained = ch.get(async_op=True).then(lambda item: item * 2)
    ch.put(21)
    assert chained.wait(30) == 42


def test_a_blocking_call_in_a_handles_callback_is_refused(cluster: Cluster) -> None:
    # A handle's callback runs in the thread that processes channel answers: a blocking
    # call there would wait for an answer only that thread can process. It is refused
    # with a ChannelError naming the way out, and nothing is lost or wedged.
    ch = create_channel(cluster, "callbacks", maxsize=0)
    chained = ch.get(async_op=True).then(lambda item: (item, ch.get(timeout=5)))
    time.sleep(0.3)  # the get waits in the channel worker: its answer comes later
    ch.put("first")
    with pytest.raises(ChannelError, match="would wait for itself"):
        chained.wait(30)
    other = create_channel(cluster, "callbacks_other", maxsize=0)
    lonely = other.get(async_op=True)  # pending: that channel is empty
    waiting = ch.get(async_op=True).then(lambda item: lonely.wait())
    time.sleep(0.3)
    ch.put("second")
    with pytest.raises(ChannelError, match="would wait for itself"):
        waiting.wait(30)
    other.put("third")
    assert lonely.wait(30) == "third"  # the refused wait took nothing
    ch.put("fourth")
    assert ch.get(timeout=30) == "fourth"  # the channel goes on
    assert settled(ch)["held"] == 0


def test_cancel_withdraws_a_waiting_get(cluster: Cluster) -> None:
    ch = create_channel(cluster, "cancel", maxsize=0)
    work = ch.get(async_op=True)
    time.sleep(0.3)
    assert work.cancel() is True
    with pytest.raises(WorkCancelledError):
        work.wait(30)
    ch.put("survivor")
    assert ch.get(timeout=30) == "survivor"  # the withdrawn get took nothing

    # A task awaiting a get is cancelled: the get is withdrawn too.
    async def cancelled_await() -> None:
        task = asyncio.ensure_future(ch.get(async_op=True).async_wait())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_await())
    time.sleep(0.3)
    ch.put("second survivor")
    assert ch.get(timeout=30) == "second survivor"
    assert ch.stats()["waiting_getters"] == 0
    # Too late to cancel: a get that has its item completes as usual.
    ch.put("granted")
    work = ch.get(async_op=True)
    assert work.wait(30) == "granted"
    assert work.cancel() is False


def test_get_timeout_loses_nothing(cluster: Cluster, peers: tuple[Any, Any]) -> None:
    a, b = peers
    ch = create_channel(cluster, "timeouts", maxsize=0)
    for _ in range(5):
        with pytest.raises(ChannelEmpty):
            ch.get(timeout=0.05)
    with pytest.raises(WorkerError, match="ChannelEmpty") as info:
        b.get_n("timeouts", 1, 0.1).wait()
    assert isinstance(info.value.__cause__, ChannelEmpty)  # pickled back from the worker
    a.put_all("timeouts", list(range(20))).wait()
    got = [ch.get(timeout=30) for _ in range(20)]
    assert got == list(range(20))
    assert ch.empty()


def test_maxsize_blocks_producer_and_bounds_memory(
    cluster: Cluster, peers: tuple[Any, Any]
) -> None:
    a, b = peers
    a.create("bounded", 2).wait()
    ch = connect_channel(cluster, "bounded")
    assert a.put_all("bounded", [torch.ones(100), torch.ones(100)]).wait() == [2]
    probe = a.put_async_probe("bounded", torch.full((100,), 3.0), 1.0).wait()[0]
    assert probe == {"done_early": False, "is_channel_work": True}
    st = ch.stats()
    assert st["held"] == 2  # the third payload has not travelled: no slot for it
    assert st["waiting_putters"] == 1
    assert torch.equal(b.get_n("bounded", 1, 30.0).wait()[0][0], torch.ones(100))
    assert a.finish_pending(30.0).wait() == [True]
    rest = [ch.get(timeout=30) for _ in range(2)]
    assert [float(t[0]) for t in rest] == [1.0, 3.0]
    assert settled(ch)["held"] == 0


def test_handle_pickles_and_reconnects_in_a_worker(
    cluster: Cluster, peers: tuple[Any, Any]
) -> None:
    _, b = peers
    ch = create_channel(cluster, "passed", maxsize=0)
    for i in range(3):
        ch.put(i)
    assert b.take_from(ch, 3).wait() == [[0, 1, 2]]
    assert pickle.loads(pickle.dumps(ch)) is ch  # the driver's own handle


def test_bad_input_is_refused_and_the_channel_stays_usable(
    cluster: Cluster, peers: tuple[Any, Any]
) -> None:
    a, _ = peers
    ch = create_channel(cluster, "bad", maxsize=1)
    with pytest.raises(ChannelExistsError, match="already exists"):
        create_channel(cluster, "bad")
    with pytest.raises(WorkerError, match="already exists"):
        a.create("bad").wait()
    t0 = time.monotonic()
    with pytest.raises(ChannelNotFoundError, match="no channel named 'missing'"):
        connect_channel(cluster, "missing", timeout=0.5)
    assert time.monotonic() - t0 >= 0.4
    with pytest.raises(ValueError, match="name='a:b'"):
        create_channel(cluster, "a:b")
    with pytest.raises(TypeError, match="name must be a str"):
        create_channel(cluster, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node_id=5 is out of range"):
        create_channel(cluster, "far", node_id=5)
    with pytest.raises(ValueError, match="maxsize must be >= 0"):
        create_channel(cluster, "neg", maxsize=-1)
    with pytest.raises(TypeError, match="maxsize must be an int"):
        create_channel(cluster, "float", maxsize=1.5)  # type: ignore[arg-type]
    for bad in (-1, True, float("nan")):  # the stack's one timeout rule
        with pytest.raises(ValueError, match=r"^timeout: got .*or None \(no limit\)$"):
            ch.get(timeout=bad)
    with pytest.raises(ValueError, match="max_items must be in 1"):
        ch.get_batch(max_items=0)
    with pytest.raises(TypeError, match="max_bytes must be an int"):
        ch.get_batch(max_items=2, max_bytes=1.5)  # type: ignore[arg-type]
    # Items the transport refuses: the reserved slot is freed, nothing is queued.
    with pytest.raises(ValueError, match="not contiguous"):
        ch.put(torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="cannot be pickled"):
        ch.put(lambda: None)
    # The refused items' slots come back once their stand-ins have reached the channel.
    deadline = time.monotonic() + 30
    while (st := ch.stats())["voids"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (st["held"], st["queued"], st["voids"]) == (0, 0, 2)
    ch.put("fine")
    assert ch.get() == "fine"


def test_put_credits_go_back_and_never_wedge_a_full_channel(cluster: Cluster) -> None:
    ch = create_channel(cluster, "credits", maxsize=8)
    ch.put("first")  # asks for credits: the channel lends up to maxsize // 4 free slots
    assert ch.qsize() == 1  # lent slots are no items
    ch.put("second")  # a plain send on a credit
    assert ch.qsize() == 2
    deadline = time.monotonic() + 30
    while (st := ch.stats())["credits"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (st["credits"], st["held"], st["queued"]) == (0, 2, 2)  # idle credits came back
    # Async puts beyond maxsize: some wait for room while credits are out; all get in.
    works = [ch.put(i, async_op=True) for i in range(12)]
    time.sleep(0.3)
    assert ch.get_batch(max_items=2) == ["first", "second"]
    got = [ch.get(timeout=30) for _ in range(12)]
    assert got == list(range(12))
    for work in works:
        work.wait(30)
    assert settled(ch)["held"] == 0
    ch.destroy()
