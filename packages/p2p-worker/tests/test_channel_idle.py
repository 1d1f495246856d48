"""Channel operations that wait longer than the job's ``op_timeout``.

A put waiting for room, or a get waiting for an item, sends nothing while it waits. The
receives that wait for a peer's next request (channel worker) or next answer (client)
must not end at the collective's ``op_timeout``, which a job may set short: they did,
and the waiting put then failed with ``ChannelError`` and its link was reset (seen in
CI as a producer's put failing before its channel worker was killed). Real worker
processes, a real channel worker, a real local Ray cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from channel_helpers import wait_for

from p2p_worker import Cluster, NodePlacementStrategy, Worker, create_channel

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)
SHORT = 0.5  # the job's op_timeout, seconds
IDLE = 4 * SHORT  # how long the operations wait, well past it


@pytest.fixture
def short_cluster(ray_session: object) -> Iterator[Cluster]:
    """A job whose collective op_timeout is :data:`SHORT` seconds."""
    config = {"cluster": {"collective": {"init_timeout": 60.0, "op_timeout": SHORT}}}
    c = Cluster(num_nodes=1, config=config)
    yield c
    c.shutdown()


class Idler(Worker):
    def put_two(self, name: str) -> float:
        """Put two items into a channel of maxsize 1; seconds the second put waited."""
        ch = self.connect_channel(name, timeout=30)
        ch.put("a", timeout=60)
        t0 = time.monotonic()
        ch.put("b", timeout=60)
        return time.monotonic() - t0

    def get_one(self, name: str) -> tuple[Any, float]:
        """Get one item; the item and the seconds the get waited."""
        ch = self.connect_channel(name, timeout=30)
        t0 = time.monotonic()
        item = ch.get(timeout=60)
        return item, time.monotonic() - t0


def test_waiting_put_and_get_outlive_a_short_op_timeout(short_cluster: Cluster) -> None:
    ch = create_channel(short_cluster, "idle_room", maxsize=1)
    producer = Idler.create_group().launch(short_cluster, ONE, name="idle_producer")
    consumer = Idler.create_group().launch(short_cluster, ONE, name="idle_consumer")
    assert ch.qsize(timeout=30) == 0  # the driver's link is open (and idle from here on)
    waited = producer.put_two("idle_room")  # the second put waits for room
    wait_for(lambda: ch.stats()["waiting_putters"] == 1)
    time.sleep(IDLE)
    assert not waited.done()
    assert ch.get(timeout=30) == "a"  # room: the waiting put goes through
    [seconds] = waited.wait(60)
    assert seconds >= IDLE
    assert ch.get(timeout=30) == "b"
    got = consumer.get_one("idle_room")  # waits on the empty channel
    wait_for(lambda: ch.stats()["waiting_getters"] == 1)
    time.sleep(IDLE)
    ch.put("c", timeout=30)
    [(item, seconds)] = got.wait(60)
    assert (item, seconds >= IDLE) == ("c", True)
    wait_for(lambda: ch.stats()["held"] == 0)  # the consumer's ack leaves within 2-10 ms
    st = ch.stats()
    assert (st["resets"], st["failures"]) == (0, 0)  # no link was reset
    ch.destroy()
