"""Small items ride inside their put requests: order, the bound and waiting puts still hold.

A put of an item without tensors whose pickle is at most ``INLINE_BYTES`` long carries
the item in its request (``p2p_worker._channels._client.inline``); these tests mix such puts
with tensor and large-object puts through a real channel worker on a real local Ray
cluster, with a producer worker and the driver.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from channel_helpers import wait_for

from p2p_asyncwork import WorkCancelledError
from p2p_worker import (
    ChannelClosedError,
    ChannelFull,
    Cluster,
    NodePlacementStrategy,
    Worker,
    create_channel,
)
from p2p_worker._channels._client.inline import rides_inline
from p2p_worker._channels._protocol.proto import INLINE_BYTES

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)


def mixed(i: int) -> Any:
    """Item ``i``: a small dict (inline), a tensor or a large string (payload path)."""
    if i % 3 == 0:
        return torch.full((64,), float(i))
    if i % 3 == 1:
        return f"{i:06d}" + "x" * (2 * INLINE_BYTES)
    return {"step": i, "tag": "small"}


def index(item: Any) -> int:
    if isinstance(item, torch.Tensor):
        assert torch.equal(item, torch.full((64,), item[0].item()))
        return int(item[0])
    if isinstance(item, str):
        return int(item[:6])
    assert item["tag"] == "small"
    return int(item["step"])


class Producer(Worker):
    def put_mixed(self, name: str, count: int) -> int:
        """Async puts of ``count`` mixed items, all issued at once; wait for all."""
        ch = self.connect_channel(name)
        works = [ch.put(mixed(i), async_op=True) for i in range(count)]
        for i in range(count):  # blocking puts in between, small ones too
            ch.put({"step": count + i, "tag": "small"}, key="blocking")
        for w in works:
            w.wait(120)
        return count


def test_the_rule_for_riding_inline() -> None:
    assert rides_inline({"step": 1, "reward": 0.5})
    assert not rides_inline(torch.zeros(2))
    assert not rides_inline({"obs": torch.zeros(2)})  # a dict of tensors: payload path
    assert not rides_inline("x" * (INLINE_BYTES + 1))
    assert not rides_inline(lambda: None)  # the payload path reports it


def test_mixed_puts_keep_producer_order_within_maxsize(cluster: Cluster) -> None:
    ch = create_channel(cluster, "inline-order", maxsize=2)
    producer = Producer.create_group().launch(cluster, ONE, name="inl_p")
    done = producer.put_mixed("inline-order", 45)
    got: list[int] = []
    held_max = 0
    while len(got) < 45:
        got.append(index(ch.get(timeout=60)))
        if len(got) % 5 == 0:
            st = ch.stats()
            held_max = max(held_max, st["held"])
            assert st["held"] <= 2, st  # waiting inline puts hold no slot
    assert got == list(range(45))  # FIFO per producer across both paths
    assert [ch.get(key="blocking", timeout=60)["step"] for _ in range(45)] == list(range(45, 90))
    assert done.wait() == [45]
    st = ch.stats()
    assert st["inline"] >= 45 // 3, st  # the blocking small puts, at least, rode inline
    assert (st["puts"], st["voids"]) == (90, 0), st


def test_a_waiting_inline_put_times_out_is_cancelled_and_ends_on_destroy(
    cluster: Cluster,
) -> None:
    ch = create_channel(cluster, "inline-wait", maxsize=1)
    ch.put({"n": 1})
    assert ch.stats()["inline"] == 1
    t0 = time.monotonic()
    with pytest.raises(ChannelFull):
        ch.put({"n": 2}, timeout=0.3)
    assert time.monotonic() - t0 >= 0.25
    with pytest.raises(ChannelFull):
        ch.put_nowait({"n": 3})
    work = ch.put({"n": 4}, async_op=True)
    wait_for(lambda: ch.stats()["waiting_putters"] == 1)  # the put waits at the channel
    assert not work.done()
    assert work.cancel() is True
    with pytest.raises(WorkCancelledError):
        work.wait(10)
    st = ch.stats()
    assert (st["held"], st["queued"], st["waiting_putters"]) == (1, 1, 0), st
    # A waiting inline put is granted once a get makes room: its item follows in order.
    later = ch.put({"n": 5}, async_op=True)
    wait_for(lambda: ch.stats()["waiting_putters"] == 1)
    assert ch.get(timeout=30) == {"n": 1}
    later.wait(30)
    assert ch.get(timeout=30) == {"n": 5}
    assert ch.stats()["inline"] == 2
    ch.put({"n": 6})  # waits for the acknowledgement of n=5 to free the slot
    pending = ch.put({"n": 7}, async_op=True)
    behind = ch.put({"n": 8}, async_op=True)  # behind it: not inline, waits too
    wait_for(lambda: ch.stats()["waiting_putters"] == 2)
    ch.destroy()
    for work in (pending, behind):
        with pytest.raises(ChannelClosedError):
            work.wait(30)
