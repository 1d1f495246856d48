"""A blocking get() takes a few queued items ahead (the consumer's prefetch buffer).

Real worker processes, a real channel worker and a real local Ray cluster: order per
consumer, ``maxsize`` and ``qsize`` with prefetched items, unused items going back (idle,
close, a by-weight batch), a consumer killed while holding prefetched items, a link reset
while it holds them, and a second consumer that is not starved.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import ray
import torch
from channel_helpers import channel_actor, settled, wait_for

from p2p_worker import (
    ChannelEmpty,
    Cluster,
    NodePlacementStrategy,
    Worker,
    create_channel,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)


class Taker(Worker):
    def hold_items(self, hold: bool) -> int:
        """Keep prefetched items for a minute (``hold``) instead of 50 ms; this pid."""
        from p2p_worker._channels._client import prefetch

        prefetch.PREFETCH_LINGER = 60.0 if hold else 0.05
        return os.getpid()

    def gets(self, name: str, count: int) -> list[Any]:
        """``count`` blocking gets, one after another."""
        ch = self.connect_channel(name)
        return [ch.get(timeout=60) for _ in range(count)]

    def get_then_batch(self, name: str, weight: int) -> list[Any]:
        """One blocking get, then a by-weight batch."""
        ch = self.connect_channel(name)
        first = ch.get(timeout=60)
        return [first, ch.get_batch(target_weight=weight, timeout=60)]

    def get_then_close(self, name: str) -> Any:
        """One blocking get, then close the handle (with items still prefetched)."""
        ch = self.connect_channel(name)
        item = ch.get(timeout=60)
        ch.close()
        return item


def _fill(ch: Any, n: int) -> None:
    for i in range(n):
        ch.put(i, timeout=30)


def _sole(ch: Any, taker: Any, name: str) -> None:
    """A first get of ``taker`` (no other process got from the channel: it may prefetch)."""
    ch.put("warm", timeout=30)
    assert taker.gets(name, 1).wait(60) == [["warm"]]


def _prefetcher(
    cluster: Cluster, worker: str, name: str, hold: bool, fill: int
) -> tuple[Any, Any, int]:
    """A sole consumer ``worker`` of a fresh channel ``name`` holding ``fill`` items.

    Returns the consumer, the channel and the consumer's pid. ``hold``: its prefetched
    items stay until a get takes them (else they go back after 50 ms without a get).
    """
    taker = Taker.create_group().launch(cluster, ONE, name=worker)
    [pid] = taker.hold_items(hold).wait(60)
    ch = create_channel(cluster, name, maxsize=16)
    _sole(ch, taker, name)
    _fill(ch, fill)
    return taker, ch, pid


def test_a_blocking_get_prefetches_small_items_in_order(cluster: Cluster) -> None:
    taker, ch, _ = _prefetcher(cluster, "prefetcher", "prefetch_order", True, 12)
    assert taker.gets("prefetch_order", 1).wait(60) == [[0]]
    wait_for(lambda: ch.stats()["gets"] == 2)  # "warm" and 0 are acknowledged
    # Eight items left the channel in one answer: seven wait in the consumer's buffer,
    # keeping their slots (maxsize holds); qsize counts only what is still queued.
    st = ch.stats()
    assert (st["prefetched"], st["queued"], st["held"] - st["credits"]) == (7, 4, 11), st
    assert ch.qsize() == 4
    ch.put("late", timeout=30)  # a later item comes after every prefetched one
    assert taker.gets("prefetch_order", 12).wait(60) == [[*range(1, 12), "late"]]
    st = settled(ch)
    assert (st["gets"], st["queued"], st["held"], st["resets"]) == (14, 0, 0, 0), st
    # Items with tensors are never taken ahead: each blocking get takes one.
    for i in range(3):
        ch.put(torch.full((4,), float(i)), timeout=30)
    before = ch.stats()["prefetched"]
    [[got]] = taker.gets("prefetch_order", 1).wait(60)
    assert torch.equal(got, torch.zeros(4))
    assert ch.stats()["prefetched"] == before
    assert ch.qsize() == 2
    [rest] = taker.gets("prefetch_order", 2).wait(60)
    assert [float(t[0]) for t in rest] == [1.0, 2.0]
    ch.destroy()


def test_unused_prefetched_items_go_back_and_no_consumer_starves(cluster: Cluster) -> None:
    # hold False, the default: items go back after 50 ms without a get
    taker, ch, _ = _prefetcher(cluster, "idle_prefetcher", "prefetch_back", False, 10)
    assert taker.gets("prefetch_back", 1).wait(60) == [[0]]
    assert ch.stats()["prefetched"] == 7
    # The driver, a second consumer, is not starved: it takes the queued items at once
    # and the idle consumer's seven, in their order, once they have gone back.
    t0 = time.monotonic()
    got = [ch.get(timeout=30) for _ in range(9)]
    assert time.monotonic() - t0 < 20.0
    assert sorted(got) == list(range(1, 10))
    assert [i for i in got if i <= 7] == list(range(1, 8))
    st = settled(ch)
    assert (st["gets"], st["queued"], st["held"]) == (11, 0, 0), st
    # Another process got within SOLE_FOR: no prefetch now, items leave one by one.
    _fill(ch, 4)
    assert taker.gets("prefetch_back", 1).wait(60) == [[0]]
    assert (ch.stats()["prefetched"], ch.qsize()) == (7, 3)
    assert [ch.get_nowait() for _ in range(3)] == [1, 2, 3]
    ch.destroy()
    # A consumer that closes its handle gives back what it did not use, at once.
    taker.hold_items(True).wait(60)
    ch = create_channel(cluster, "prefetch_close", maxsize=16)
    _fill(ch, 5)
    assert taker.get_then_close("prefetch_close").wait(60) == [0]
    assert ch.stats()["prefetched"] == 4
    assert [ch.get_nowait() for _ in range(4)] == [1, 2, 3, 4]
    ch.destroy()
    # A by-weight batch takes the prefetched items first, in order.
    ch = create_channel(cluster, "prefetch_weight", maxsize=16)
    _fill(ch, 6)
    assert taker.get_then_batch("prefetch_weight", 3).wait(60) == [[0, [1, 2, 3]]]
    assert taker.gets("prefetch_weight", 2).wait(60) == [[4, 5]]
    st = settled(ch)
    assert (st["gets"], st["queued"], st["held"]) == (6, 0, 0), st
    assert st["prefetched"] == 5 + 1  # the last get() took 5 with 4
    ch.destroy()


def test_a_consumer_killed_holding_prefetched_items_loses_none(cluster: Cluster) -> None:
    doomed, ch, pid = _prefetcher(cluster, "doomed_prefetcher", "prefetch_kill", True, 10)
    assert doomed.gets("prefetch_kill", 2).wait(60) == [[0, 1]]
    wait_for(lambda: ch.stats()["gets"] == 3)  # the two handed out are acknowledged
    st = ch.stats()
    assert st["held"] - st["credits"] == 8, st  # six prefetched, two queued
    os.kill(pid, signal.SIGKILL)
    # The six unread items go back to the head, in order: each item exactly once.
    wait_for(lambda: ch.stats()["queued"] == 8)
    assert [ch.get(timeout=30) for _ in range(8)] == list(range(2, 10))
    st = settled(ch)
    assert (st["gets"], st["queued"], st["held"]) == (11, 0, 0), st
    ch.destroy()


def test_a_link_reset_keeps_prefetched_items_with_their_consumer(cluster: Cluster) -> None:
    taker, ch, _ = _prefetcher(cluster, "reset_prefetcher", "prefetch_reset", True, 10)
    assert taker.gets("prefetch_reset", 1).wait(60) == [[0]]
    wait_for(lambda: ch.stats()["gets"] == 2)
    peer = "reset_prefetcher:0"
    gen = ch.stats()["peers"][peer]
    ray.get(channel_actor("prefetch_reset").reset_link.remote(peer, gen), timeout=30)
    # The consumer reports the seven prefetched items as arrived: they stay its own
    # (not sent to anyone else) and its next gets return them, then the rest.
    # (The report is a Ray call: on a loaded machine it may take seconds.)
    wait_for(lambda: ch.stats()["held"] == 2, timeout=60)  # only the two still queued
    assert ch.qsize() == 2
    assert taker.gets("prefetch_reset", 9).wait(60) == [list(range(1, 10))]
    st = settled(ch)
    assert (st["gets"], st["queued"], st["held"]) == (11, 0, 0), st
    assert st["resets"] >= 1
    with pytest.raises(ChannelEmpty):
        ch.get_nowait()
    ch.destroy()


class Putter(Worker):
    def put_many(self, name: str, tag: str, count: int) -> int:
        """Put ``count`` small items ``(tag, i)``, blocking, in order."""
        ch = self.connect_channel(name)
        for i in range(count):
            ch.put((tag, i), timeout=60)
        return count


def test_two_producers_keep_their_order_through_a_prefetching_consumer(
    cluster: Cluster,
) -> None:
    taker = Taker.create_group().launch(cluster, ONE, name="fifo_prefetcher")
    putters = [Putter.create_group().launch(cluster, ONE, name=f"fifo_put{i}") for i in (0, 1)]
    ch = create_channel(cluster, "prefetch_fifo", maxsize=16)
    _sole(ch, taker, "prefetch_fifo")
    n = 150
    puts = [p.put_many("prefetch_fifo", f"p{i}", n) for i, p in enumerate(putters)]
    wait_for(lambda: ch.qsize() >= 8)  # the first get finds items queued, at least
    got_work = taker.gets("prefetch_fifo", 2 * n)
    assert [w.wait(120) for w in puts] == [[n], [n]]
    [got] = got_work.wait(120)
    for tag in ("p0", "p1"):  # each producer's items, once each, in the order put
        assert [i for t, i in got if t == tag] == list(range(n))
    st = settled(ch)
    assert (st["gets"], st["queued"], st["held"]) == (2 * n + 1, 0, 0), st
    assert st["prefetched"] > 0, st  # some gets found items queued and took more
    ch.destroy()
