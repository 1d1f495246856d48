"""What code written for RLinf's channels meets on ours, on a real embedded Ray cluster.

Bursts of asynchronous puts from an asyncio worker method, ``asyncio.QueueEmpty`` /
``asyncio.QueueFull`` from the ``*_nowait`` calls, a ``put_nowait`` in one worker seen by
``get_nowait`` in another, ``str(channel)`` / ``peek_all`` showing the queued items, and a
channel worker launched as a worker group (``ChannelWorker.create_group``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from p2p_worker import (
    Channel,
    ChannelClosedError,
    ChannelNotFoundError,
    ChannelWorker,
    Cluster,
    NodePlacementStrategy,
    Worker,
    WorkerError,
    create_channel,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)


class Burst(Worker):
    """An asyncio worker (it has coroutine methods), as RLinf's test producers are."""

    async def burst_one_key(self, channel: Channel, n: int) -> list[Any]:
        for i in range(n):  # none awaited: every request leaves before any answer is read
            channel.put(i, key="burst", async_op=True)
        return [await channel.get(key="burst", async_op=True).async_wait() for _ in range(n)]

    async def burst_many_keys(self, channel: Channel, n: int) -> list[Any]:
        for i in range(n):
            channel.put(i, key=f"k{i}", async_op=True)
        works = [channel.get(key=f"k{i}", async_op=True) for i in range(n)]
        return list(await asyncio.gather(*(w.async_wait() for w in works)))

    def put_nowait(self, channel: Channel, item: Any, key: str) -> bool:
        channel.put_nowait(item, key=key)
        return True

    def get_nowait(self, channel: Channel, key: str) -> Any:
        try:
            return channel.get_nowait(key=key)
        except asyncio.QueueEmpty:  # RLinf's error; ours is also a queue.Empty
            return "<empty>"

    def connect_put(self, name: str, items: list[Any]) -> int:
        channel = Channel.connect(name, self)
        for item in items:
            channel.put(item)
        return len(items)

    def put_nowait_full(self, channel: Channel) -> str:
        try:
            channel.put_nowait("over")
        except asyncio.QueueFull:
            return "<full>"
        return "<put>"


@pytest.fixture(scope="module")
def cluster(ray_session: object) -> Iterator[Cluster]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = Cluster(num_nodes=1)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def pair(cluster: Cluster) -> tuple[Any, Any]:
    a = Burst.create_group().launch(cluster, ONE, name="rlinf_a")
    b = Burst.create_group().launch(cluster, ONE, name="rlinf_b")
    return a, b


@pytest.fixture
def fresh(cluster: Cluster) -> Iterator[list[Channel]]:
    """Channels a test creates, destroyed after it."""
    made: list[Channel] = []
    yield made
    for ch in made:
        with contextlib.suppress(ChannelNotFoundError, ChannelClosedError):
            ch.destroy(timeout=10.0)


def test_a_burst_of_async_puts_then_gets_of_one_key(
    cluster: Cluster, pair: tuple[Any, Any], fresh: list[Channel]
) -> None:
    # 1000 un-awaited puts fill the control group's buffer before the channel worker
    # answers; the process must keep reading answers while its caller waits to send.
    ch = create_channel(cluster, "burst_one")
    fresh.append(ch)
    a, _ = pair
    assert a.burst_one_key(ch, 1000).wait(240) == [list(range(1000))]
    assert ch.stats()["queued"] == 0


def test_a_burst_of_async_puts_over_many_keys(
    cluster: Cluster, pair: tuple[Any, Any], fresh: list[Channel]
) -> None:
    ch = create_channel(cluster, "burst_many")
    fresh.append(ch)
    a, _ = pair
    assert a.burst_many_keys(ch, 1000).wait(240) == [list(range(1000))]


def test_nowait_calls_raise_asyncio_errors_and_a_returned_put_is_seen(
    cluster: Cluster, pair: tuple[Any, Any], fresh: list[Channel]
) -> None:
    ch = create_channel(cluster, "nowait_rlinf", maxsize=1)
    fresh.append(ch)
    a, b = pair
    assert b.get_nowait(ch, "nowait").wait() == ["<empty>"]
    assert a.put_nowait(ch, "item_100", "nowait").wait() == [True]
    # the put returned in one process: another process's get_nowait finds the item
    assert b.get_nowait(ch, "nowait").wait() == ["item_100"]
    assert a.put_nowait(ch, "fill", "nowait").wait() == [True]
    assert b.put_nowait_full(ch).wait() == ["<full>"]
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait(key="other")
    assert ch.get_nowait(key="nowait") == "fill"


def test_str_and_peek_all_show_the_queued_items(
    cluster: Cluster, pair: tuple[Any, Any], fresh: list[Channel]
) -> None:
    ch = Channel.create("peek_rlinf", cluster=cluster)
    fresh.append(ch)
    for item in ("item1", "item2", "item3"):
        ch.put(item)
    ch.put("elsewhere", key="other")
    assert str(ch) == "['item1', 'item2', 'item3']"
    assert ch.peek_all("other") == ["elsewhere"]
    assert ch.get() == "item1"  # peeking took nothing
    assert ch.peek_all() == ["item2", "item3"]
    a, _ = pair
    assert a.put_nowait(ch, "from_a", "default_queue").wait() == [True]
    assert ch.peek_all() == ["item2", "item3", "from_a"]


def test_a_channel_worker_launched_as_a_group_serves_its_name(
    cluster: Cluster, pair: tuple[Any, Any]
) -> None:
    group = ChannelWorker.create_group(maxsize=2).launch(
        cluster, NodePlacementStrategy([0]), name="launched_ch", max_concurrency=2**31 - 1
    )
    try:
        ch = Channel.connect("launched_ch", cluster=cluster)
        assert ch.maxsize == 2
        a, _ = pair
        assert a.connect_put("launched_ch", ["x", {"y": 1}]).wait(60) == [2]
        assert ch.full()
        assert ch.qsize() == 2
        assert [ch.get(timeout=30), ch.get(timeout=30)] == ["x", {"y": 1}]
        assert ch.empty()
    finally:
        group.shutdown()


def test_a_channel_worker_group_of_several_is_refused(cluster: Cluster) -> None:
    with pytest.raises(WorkerError, match="distributed channel"):
        ChannelWorker.create_group(maxsize=0).launch(
            cluster, NodePlacementStrategy([0, 0]), name="spread_ch"
        )
    with pytest.raises(WorkerError, match="launched group"):
        ChannelWorker(maxsize=3)
