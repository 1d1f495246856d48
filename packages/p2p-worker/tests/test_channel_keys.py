"""Keyed and weighted channel queues (RLinf's channel model), on the real ChannelQueue.

These run the channel worker's bookkeeping on a plain event loop: per-key FIFOs, batches
filled to a target weight (also from later arrivals), and what a timed-out, reset or
cancelled batch does with the items it already held.
"""

from __future__ import annotations

import asyncio
import pickle

import pytest

from p2p_worker._channels._protocol.keys import (
    DEFAULT_KEY,
    Keyed,
    batch_weight,
    check_key,
    check_weight,
    unwrap,
    wrap,
)
from p2p_worker._channels._server.queue import WAITER_RESET, ChannelQueue, Item


def put(q: ChannelQueue, obj: object, key: object = DEFAULT_KEY, weight: int = 0) -> None:
    q.held += 1
    q.arriving += 1
    q.arrived(Item(obj, 0, key, weight))


async def take(q: ChannelQueue, key: object = DEFAULT_KEY, **kw: object) -> list[object] | None:
    got = await q.take(
        "c",
        kw.pop("max_items", 1),  # type: ignore[arg-type]
        None,
        block=kw.pop("block", True),  # type: ignore[arg-type]
        timeout=kw.pop("timeout", None),  # type: ignore[arg-type]
        key=key,
        target_weight=kw.pop("target_weight", None),  # type: ignore[arg-type]
    )
    if isinstance(got, list):
        q.release(len(got))
        return [i.obj for i in got]
    return got


def test_each_key_is_its_own_fifo() -> None:
    async def run() -> tuple[object, ...]:
        q = ChannelQueue(0)
        for i in range(3):
            put(q, f"a{i}", key="a")
            put(q, f"b{i}", key=("b", 1))
        put(q, "plain")
        first_b = await take(q, ("b", 1))
        all_a = await take(q, "a", max_items=10)
        plain = await take(q)
        return first_b, all_a, plain, q.queued_for(("b", 1)), q.queued, q.held

    assert asyncio.run(run()) == (["b0"], ["a0", "a1", "a2"], ["plain"], 2, 2, 2)


def test_a_getter_waits_on_its_key_only() -> None:
    async def run() -> tuple[object, object]:
        q = ChannelQueue(0)
        waiting = asyncio.ensure_future(take(q, "mine"))
        await asyncio.sleep(0)
        put(q, "other", key="theirs")
        await asyncio.sleep(0)
        assert not waiting.done()
        put(q, "for me", key="mine")
        return await waiting, q.queued_for("theirs")

    assert asyncio.run(run()) == (["for me"], 1)


def test_batch_fills_to_target_weight_from_later_arrivals() -> None:
    async def run() -> list[object] | None:
        q = ChannelQueue(0)
        put(q, "w1", weight=1)
        batch = asyncio.ensure_future(take(q, target_weight=4))
        await asyncio.sleep(0)
        assert not batch.done()  # weight 1 of 4
        put(q, "w2", weight=2)
        await asyncio.sleep(0)
        assert not batch.done()  # weight 3 of 4
        put(q, "w1b", weight=1)
        return await batch

    assert asyncio.run(run()) == ["w1", "w2", "w1b"]


def test_batch_stops_before_an_item_that_would_exceed_the_target() -> None:
    async def run() -> tuple[object, object, object]:
        q = ChannelQueue(0)
        for name, w in (("a", 2), ("b", 3), ("c", 1)):
            put(q, name, weight=w)
        first = await take(q, target_weight=4)  # 2, then 2 + 3 > 4: stop
        heavy = await take(q, target_weight=1)  # heavier than the target: taken alone
        rest = await take(q, target_weight=0)
        return first, heavy, rest

    assert asyncio.run(run()) == (["a"], ["b"], ["c"])


def test_unweighted_items_count_one_each() -> None:
    async def run() -> list[object] | None:
        q = ChannelQueue(0)
        for i in range(5):
            put(q, i)
        return await take(q, target_weight=3)

    assert asyncio.run(run()) == [0, 1, 2]


def test_timed_out_batch_returns_what_it_has_and_reset_gives_it_back() -> None:
    async def run() -> tuple[object, object, object]:
        q = ChannelQueue(0)
        put(q, "x", weight=1)
        partial = await take(q, target_weight=10, timeout=0.05)
        put(q, "y", weight=1)
        reset = asyncio.ensure_future(
            q.take("c", 1, None, block=True, timeout=None, target_weight=10)
        )
        await asyncio.sleep(0)
        assert q.reset_peer("c") == 1
        outcome = await reset
        return partial, outcome, await take(q)

    assert asyncio.run(run()) == (["x"], WAITER_RESET, ["y"])


def test_cancelled_batch_puts_its_items_back_in_order() -> None:
    async def run() -> list[object] | None:
        q = ChannelQueue(0)
        put(q, "first", weight=1)
        put(q, "second", weight=1)
        task = asyncio.ensure_future(take(q, target_weight=10))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await take(q, max_items=5)

    assert asyncio.run(run()) == ["first", "second"]


def test_envelope_and_argument_checks() -> None:
    assert wrap("item", DEFAULT_KEY, 0) == "item"  # unkeyed items travel bare
    env = wrap({"x": 1}, "k", 2)
    assert env == Keyed("k", 2, {"x": 1})
    assert unwrap(pickle.loads(pickle.dumps(env))) == ({"x": 1}, "k", 2)
    assert unwrap("bare") == ("bare", DEFAULT_KEY, 0)
    assert batch_weight(0) == 1
    assert batch_weight(5) == 5
    with pytest.raises(TypeError, match="hashable"):
        check_key(["not", "hashable"])
    with pytest.raises(ValueError, match="weight must be >= 0, got -1"):
        check_weight(-1)
    with pytest.raises(TypeError, match="target_weight must be an int"):
        check_weight(1.5, "target_weight")


def test_a_finished_getter_does_not_hold_back_the_next() -> None:
    async def run() -> tuple[object, object]:
        q = ChannelQueue(0)
        live = asyncio.ensure_future(take(q, "x"))  # a live getter of another key, ahead
        await asyncio.sleep(0)
        assert await take(q, "k", timeout=0.01) is None  # timed out, behind the live one
        put(q, "ready", key="k")
        got = await take(q, "k", block=False)
        put(q, "for x", key="x")
        return got, await live

    assert asyncio.run(run()) == (["ready"], ["for x"])
