"""LocalChannel: RLinf's in-process channel (``Channel.create(name, local=True)``)."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from p2p_worker import Channel, ChannelEmpty, ChannelFull, LocalChannel


def test_created_by_channel_create_and_keyed_fifos() -> None:
    ch = Channel.create("local_one", maxsize=2, local=True)
    assert isinstance(ch, LocalChannel)
    assert ch.is_local
    ch.put("a")
    ch.put("b", key="k")
    ch.put("c")
    assert (ch.qsize(), ch.qsize("k"), ch.full(), ch.full("k")) == (2, 1, True, False)
    assert str(ch) == "['a', 'c']"
    assert ch.peek_all("k") == ["b"]
    assert [ch.get(), ch.get(key="k"), ch.get()] == ["a", "b", "c"]
    assert ch.empty()
    assert ch.maxsize() == 2


def test_nowait_raises_rlinf_errors_and_timeouts_expire() -> None:
    ch = LocalChannel(maxsize=1)
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()
    ch.put_nowait(1)
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait(2)
    t0 = time.monotonic()
    with pytest.raises(ChannelFull):
        ch.put(2, timeout=0.2)
    assert time.monotonic() - t0 >= 0.19
    assert ch.get() == 1
    with pytest.raises(ChannelEmpty):
        ch.get(timeout=0.1)


def test_a_blocking_get_waits_for_another_thread() -> None:
    ch = LocalChannel()
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(ch.get(timeout=30)))
    t.start()
    time.sleep(0.1)
    assert not got
    ch.put({"x": 1})
    t.join(30)
    assert got == [{"x": 1}]


def test_get_batch_by_weight_takes_what_fits() -> None:
    ch = LocalChannel()
    for item, weight in (("i1", 1), ("i2", 2), ("i3", 3)):
        ch.put(item, weight)
    assert ch.get_batch(target_weight=3) == ["i1", "i2"]
    assert ch.get_batch(target_weight=1) == ["i3"]  # the first item is always taken
    ch.put("late", 1)
    assert ch.get_batch(target_weight=5, timeout=0.1) == ["late"]  # what it held by then
    with pytest.raises(ChannelEmpty):
        ch.get_batch(target_weight=1, timeout=0.05)


def test_bad_arguments_are_refused_and_leave_it_usable() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        LocalChannel(-1)
    with pytest.raises(TypeError, match="maxsize"):
        LocalChannel("2")  # type: ignore[arg-type]
    ch = LocalChannel()
    with pytest.raises(ValueError, match="async_op"):
        ch.put(1, async_op=True)
    with pytest.raises(ValueError, match="async_op"):
        ch.get(async_op=True)
    with pytest.raises(TypeError, match="weight"):
        ch.put(1, weight=-0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key"):
        ch.put(1, key=["unhashable"])
    with pytest.raises(TypeError, match="one process"):
        pickle.dumps(ch)
    ch.put(7)
    assert ch.get() == 7
