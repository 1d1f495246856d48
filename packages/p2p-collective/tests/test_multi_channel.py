"""MultiChannelProcessGroup (RLinf's name) between real processes over real gloo groups."""

from __future__ import annotations

import logging
import socket

import mc_tasks
import pytest
import torch
from conftest import make_store

from p2p_collective import (
    Collective,
    CollectiveGroup,
    CollectiveTimeoutError,
    MultiChannelProcessGroup,
)

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_channels_do_not_wait_for_each_other() -> None:
    r0, r1 = mc_tasks.run("channels_independent", 2, free_port())
    assert r0 == [5, 6]
    assert r1 == ([7.0, 7.0, 7.0], True)


def test_both_directions_at_once_keep_order() -> None:
    r0, r1 = mc_tasks.run("both_directions", 2, free_port())
    assert r0 == [100.0 + i for i in range(20)]
    assert r1 == [float(i) for i in range(20)]


def test_size_mismatch_is_a_framing_error_logged_once() -> None:
    r0, r1 = mc_tasks.run("size_mismatch", 2, free_port())
    assert r0 == []
    kind, messages = r1
    assert kind == "FramingError"
    assert len(messages) == 1
    assert messages[0].startswith("recv failed on ProcessGroup mismatch rank 1: ")


def test_broadcast_among_three_on_given_collectives() -> None:
    store = make_store()  # the members' Collectives meet in this store
    outs = mc_tasks.run("broadcast_three", 3, store.port)
    for rank, (refused, a, b) in enumerate(outs):
        assert "send and recv need exactly 2" in refused, rank
        assert a == [1.0] * 4
        assert b == [[0.0, 1.0], [2.0, 3.0]]


def test_bad_arguments_are_refused_and_leave_it_usable() -> None:
    with pytest.raises(TypeError, match="num_channels"):
        MultiChannelProcessGroup(cur_rank=0, num_channels="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_channels"):
        MultiChannelProcessGroup(cur_rank=0, num_channels=0)
    pg = MultiChannelProcessGroup(cur_rank=1, num_channels=2, logger=logging.getLogger("x"))
    assert not pg.is_initialized
    assert pg.num_channels == 2
    with pytest.raises(RuntimeError, match="not initialized"):
        pg.send(torch.ones(1), CollectiveGroup.CPU, 0)
    with pytest.raises(ValueError, match="exactly one"):
        pg.init()
    with pytest.raises(ValueError, match="rank: got 0"):
        pg.init("tcp://127.0.0.1:1", rank=0)
    with pytest.raises(ValueError, match="world_size"):
        pg.init("tcp://127.0.0.1:1", world_size=1)
    assert not pg.is_initialized
    assert "not initialized" in repr(pg)


def test_device_constants_are_rlinfs() -> None:
    assert CollectiveGroup.CPU == "cpu"
    assert CollectiveGroup.ACCEL == "cuda"


def test_init_times_out_when_the_peer_never_comes() -> None:
    store = make_store()
    coll = Collective("alone", store, timeout=5.0)
    pg = MultiChannelProcessGroup(cur_rank=0, num_channels=1)
    try:
        for _ in range(2):  # a failed init may be called again
            with pytest.raises(CollectiveTimeoutError, match="member 1 did not arrive"):
                pg.init(world_size=2, group_name="lonely", collective=coll, timeout=0.5)
            assert not pg.is_initialized
    finally:
        coll.close()
