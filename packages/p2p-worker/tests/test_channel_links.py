"""Channel requests over collective links: issue order, and a consumer killed mid-get.

Puts and gets travel as messages on the process's control group to the channel worker
(no Ray call per item); a get's answer carries its items on the process's link. These
tests use real worker processes, a real channel worker and a real local Ray cluster.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import ray
from channel_helpers import channel_actor, drain, wait_for

from p2p_worker import (
    ChannelEmpty,
    ChannelError,
    Cluster,
    NodePlacementStrategy,
    Worker,
    create_channel,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)


class Getter(Worker):
    def ordered_gets(self, name: str, count: int, keys: int) -> list[Any]:
        """Issue ``count`` async gets at once (round robin over ``keys`` keys); their items."""
        ch = self.connect_channel(name)
        works = [ch.get(key=f"k{i % keys}", async_op=True) for i in range(count)]
        return [w.wait(60) for w in works]

    def park_gets(self, name: str, count: int) -> int:
        """Issue ``count`` async gets on an empty channel and leave them waiting."""
        ch = self.connect_channel(name)
        self._parked = [ch.get(async_op=True) for _ in range(count)]
        return os.getpid()

    def collect_parked(self, timeout: float) -> list[Any]:
        """The outcomes of the gets left by :meth:`park_gets`: items, or error type names."""
        out = []
        for w in self._parked:
            try:
                out.append(w.wait(timeout))
            except Exception as exc:
                out.append(type(exc).__name__)
        return out

    def get_n(self, name: str, count: int) -> list[Any]:
        ch = self.connect_channel(name)
        return [ch.get(timeout=60) for _ in range(count)]


class Putter(Worker):
    def tracked_puts(self, name: str, count: int, window: int) -> list[bool]:
        """Put ``(i, 2 KiB)`` for i < ``count``, ``window`` async puts in flight; each outcome.

        The items are too big to ride in a request: each payload travels on its own (a
        credit, or after a grant) and its put completes with the channel worker's receipt.
        """
        ch = self.connect_channel(name)
        works: list[Any] = []
        ok: list[bool] = []

        def settle(work: Any) -> None:
            try:
                work.wait(60)
                ok.append(True)
            except ChannelError:
                ok.append(False)

        for i in range(count):
            works.append(ch.put((i, b"x" * 2048), async_op=True))
            if len(works) >= window:
                settle(works.pop(0))
        for work in works:
            settle(work)
        return ok

    def puts_then_close(self, name: str, count: int) -> list[str]:
        """``count`` async puts of ``(i, 2 KiB)``, then close the handle; each outcome."""
        ch = self.connect_channel(name)
        works = [ch.put((i, b"x" * 2048), async_op=True) for i in range(count)]
        ch.close()
        out = []
        for work in works:
            try:
                work.wait(60)
                out.append("ok")
            except ChannelError as exc:
                out.append(type(exc).__name__)
        return out


def test_async_gets_of_one_consumer_are_served_in_issue_order(cluster: Cluster) -> None:
    getter = Getter.create_group().launch(cluster, ONE, name="orderly")
    ch = create_channel(cluster, "ordered", maxsize=0)
    # Items first, then gets: each get takes the next item of its key.
    for i in range(12):
        ch.put(i, key=f"k{i % 3}")
    assert getter.ordered_gets("ordered", 12, 3).wait(60) == [list(range(12))]
    # Gets first (all waiting), then items: still served in the order they were issued.
    waiting = getter.ordered_gets("ordered", 16, 1)
    wait_for(lambda: ch.stats()["waiting_getters"] == 16)
    for i in range(16):
        ch.put(100 + i, key="k0")
    assert waiting.wait(60) == [[100 + i for i in range(16)]]
    assert ch.stats()["resets"] == 0
    ch.destroy()


def test_consumer_killed_mid_get_loses_no_item(cluster: Cluster) -> None:
    doomed = Getter.create_group().launch(cluster, ONE, name="doomed_getter")
    survivor = Getter.create_group().launch(cluster, ONE, name="survivor_getter")
    ch = create_channel(cluster, "midget", maxsize=4, transfer_timeout=30.0)
    [pid] = doomed.park_gets("midget", 4).wait(60)
    wait_for(lambda: ch.stats()["waiting_getters"] == 4)
    # Frozen, the consumer still counts as alive: its four gets are served, their items
    # sent on its link, but it never acknowledges them. Then it dies, mid-get.
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(4):
            ch.put(i, timeout=30)
        wait_for(lambda: ch.stats()["waiting_getters"] == 0)
        st = ch.stats()
        assert (st["held"], st["queued"], st["gets"]) == (4, 0, 0)  # taken, not delivered
    finally:
        os.kill(pid, signal.SIGKILL)
    # The channel worker sees the death and puts the four items back at the head, in order.
    assert survivor.get_n("midget", 4).wait(60) == [[0, 1, 2, 3]]
    with pytest.raises(ChannelEmpty):
        ch.get_nowait()
    wait_for(lambda: ch.stats()["held"] == 0)
    st = ch.stats()
    assert (st["queued"], st["gets"]) == (0, 4)  # each item delivered exactly once
    assert st["failures"] >= 1
    ch.put("still works")
    assert ch.get(timeout=30) == "still works"
    ch.destroy()


def test_link_reset_after_items_arrived_delivers_them_once(cluster: Cluster) -> None:
    """A live consumer's link is reset after its items reached it, before its ack did.

    The items must not go back to the channel (they would be delivered twice): the
    consumer reports what arrived, and only the rest goes back.
    """
    holder = Getter.create_group().launch(cluster, ONE, name="reset_holder")
    ch = create_channel(cluster, "resetonce", maxsize=4, transfer_timeout=30.0)
    [pid] = holder.park_gets("resetonce", 2).wait(60)
    wait_for(lambda: ch.stats()["waiting_getters"] == 2)
    os.kill(pid, signal.SIGSTOP)  # the answers wait in its socket; no ack can leave
    try:
        ch.put("a", timeout=30)
        ch.put("b", timeout=30)
        wait_for(lambda: ch.stats()["waiting_getters"] == 0)
        st = ch.stats()
        assert (st["held"], st["gets"]) == (2, 0)  # sent, not acknowledged
        peer = "reset_holder:0"
        gen = st["peers"][peer]
        ray.get(channel_actor("resetonce").reset_link.remote(peer, gen), timeout=30)
        assert ch.stats()["peers"][peer] == gen + 1  # the link was reset
    finally:
        os.kill(pid, signal.SIGCONT)
    # "a" arrived and is delivered; its failed ack breaks the link, so the second get
    # may fail ("nothing was taken") and its item go back to the channel.
    [outcomes] = holder.collect_parked(60).wait(60)
    assert outcomes[0] == "a", outcomes
    assert outcomes[1] in ("b", "ChannelError"), outcomes
    delivered = [o for o in outcomes if o in ("a", "b")]
    wait_for(lambda: ch.stats()["held"] == 2 - len(delivered))  # settled by its report
    rest = drain(ch)
    assert sorted(delivered + rest) == ["a", "b"]  # each item exactly once
    st = ch.stats()
    assert (st["held"], st["queued"], st["gets"]) == (0, 0, 2)
    ch.put("c")  # the channel and the consumer's handle keep working
    assert holder.get_n("resetonce", 1).wait(60) == [["c"]]
    ch.destroy()


def test_link_resets_during_puts_leave_exactly_the_confirmed_items(cluster: Cluster) -> None:
    """Resets while a producer's payloads are in flight: a put that succeeded has its item
    in the channel exactly once, a put that failed has not, and order holds."""
    putter = Putter.create_group().launch(cluster, ONE, name="reset_putter")
    ch = create_channel(cluster, "resetputs", maxsize=0, transfer_timeout=30.0)
    count = 400
    handle = putter.tracked_puts("resetputs", count, 16)
    actor, peer, resets, last = channel_actor("resetputs"), "reset_putter:0", 0, 0
    while not handle.done() and resets < 8:
        st = ch.stats()
        gen = st["peers"].get(peer)
        # Each reset once the producer moves again on the link it connected after the
        # last one (a reset in the middle of connecting would only delay it): counted
        # from after the late payloads of the reset link have landed.
        if gen is not None and st["puts"] >= last + 40:
            ray.get(actor.reset_link.remote(peer, gen), timeout=30)
            time.sleep(0.2)
            resets, last = resets + 1, ch.stats()["puts"]
        time.sleep(0.01)
    [ok] = handle.wait(120)
    assert len(ok) == count
    assert resets >= 1
    assert ch.stats()["resets"] >= resets
    confirmed = [i for i in range(count) if ok[i]]
    failed = count - len(confirmed)
    there = [item[0] for item in drain(ch)]
    assert there == confirmed, f"{failed} puts failed; channel vs confirmed differ"
    assert failed < count  # most went through: the producer reconnected after each reset
    ch.put(("after", b""))  # the channel and the producer's handle keep working
    assert ch.get(timeout=30)[0] == "after"
    ch.destroy()


def test_closing_a_handle_settles_its_puts_in_flight(cluster: Cluster) -> None:
    """Async puts, then close() at once: every handle completes, true to what arrived."""
    putter = Putter.create_group().launch(cluster, ONE, name="closing_putter")
    ch = create_channel(cluster, "closeputs", maxsize=0)
    [outcomes] = putter.puts_then_close("closeputs", 64).wait(120)
    assert len(outcomes) == 64
    assert set(outcomes) <= {"ok", "ChannelError", "ChannelClosedError"}, outcomes
    there = [item[0] for item in drain(ch)]
    assert there == [i for i, o in enumerate(outcomes) if o == "ok"]
    ch.destroy()
