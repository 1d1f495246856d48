"""A consumer's gets are served in the order it issued them, whatever order Ray starts them in."""

from __future__ import annotations

import asyncio
import random

import pytest

from p2p_worker import Cluster, create_channel
from p2p_worker._channels.server import _Turns


def test_turns_let_calls_pass_in_issue_order_when_they_arrive_shuffled() -> None:
    async def run() -> list[int]:
        turns, order = _Turns(), []

        async def call(seq: int, delay: float) -> None:
            await asyncio.sleep(delay)
            turns.arrive(seq)
            await turns.turn(seq, "get")
            order.append(seq)
            turns.passed(seq)

        rng = random.Random(7)
        await asyncio.gather(*(call(s, rng.random() / 50) for s in range(30)))
        return order

    assert asyncio.run(run()) == list(range(30))


def test_a_lost_call_is_skipped_but_one_that_arrived_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import p2p_worker._channels.server as server

    monkeypatch.setattr(server, "TURN_WAIT", 0.05)

    async def run() -> tuple[list[int], int]:
        turns, order = _Turns(), []
        turns.arrive(1)  # seq 0 never comes; seq 1 arrived and is slow

        async def slow_one() -> None:
            await asyncio.sleep(0.3)
            order.append(1)
            turns.passed(1)

        async def two() -> None:
            turns.arrive(2)
            await turns.turn(2, "get")
            order.append(2)
            turns.passed(2)

        await asyncio.gather(slow_one(), two())
        return order, turns.low

    # 0 is skipped after the short wait, but 2 still goes after 1, which had arrived.
    assert asyncio.run(run()) == ([1, 2], 3)


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_many_async_gets_of_one_consumer_get_items_in_issue_order(cluster: Cluster) -> None:
    ch = create_channel(cluster, "issue-order", maxsize=0)
    # Waiting gets first, then the items come one by one.
    works = [ch.get(async_op=True) for _ in range(40)]
    for i in range(40):
        ch.put(i, async_op=bool(i % 2))
    assert [w.wait(60) for w in works] == list(range(40))
    # Items queued first under three keys, then gets of every key interleaved.
    for i in range(30):
        ch.put(i, key=i % 3)
    keyed = [(i % 3, ch.get(key=i % 3, async_op=True)) for i in range(30)]
    for key in range(3):
        assert [w.wait(60) for k, w in keyed if k == key] == list(range(key, 30, 3))
    assert ch.qsize() == 0
