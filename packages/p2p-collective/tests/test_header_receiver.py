"""The header receives a direction keeps posted ahead (p2p_collective._wire._headers).

In-process, with a recording link: these pin the bookkeeping (two receives posted
from the first receive on, topped up before each wait, buffers reused only once the
operation that took them is over). test_header_posting.py checks the behaviour between
real processes over both transports.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from p2p_collective import HEADER_MAX
from p2p_collective._frames._recvpool import PostedRecv
from p2p_collective._wire._headers import DEPTH, HeaderReceiver


class RecordingLink:
    """Records every post and wait; a wait writes a marker into the posted buffer."""

    peer = "peer"

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []  # ("post" | "wait", id of the buffer)
        self.arrived = 0

    def post_recv(self, tensor: torch.Tensor) -> PostedRecv:
        self.events.append(("post", id(tensor)))
        return PostedRecv(object(), tensor)

    def wait_recv(self, posted: PostedRecv, deadline: float | None) -> None:
        self.events.append(("wait", id(posted.tensor)))
        self.arrived += 1
        posted.tensor[4] = self.arrived  # what "arrived" in this buffer


def test_depth_is_two() -> None:
    assert DEPTH == 2


def test_the_first_receive_posts_two_then_waits_for_the_older() -> None:
    link = RecordingLink()
    r = HeaderReceiver()
    buf, view = r.receive(link, None)  # type: ignore[arg-type]
    assert buf.numel() == HEADER_MAX
    assert [e for e, _ in link.events] == ["post", "post", "wait"]
    assert link.events[2][1] == link.events[0][1] == id(buf)  # the older one first
    assert view[4] == 1
    assert r.posted == 1  # the next header's receive stays posted while this op runs


def test_each_receive_tops_up_before_it_waits_and_buffers_alternate() -> None:
    link = RecordingLink()
    r = HeaderReceiver()
    taken = []
    for _ in range(6):
        before = len(link.events)
        buf, view = r.receive(link, None)  # type: ignore[arg-type]
        taken.append(id(buf))
        assert view[4] == link.arrived  # the buffer returned holds what arrived last
        assert r.posted == 1
        if before:  # after the first: one post (into the buffer just freed), one wait
            assert link.events[before:] == [("post", taken[-2]), ("wait", id(buf))]
    assert len(set(taken)) == 2
    assert all(a != b for a, b in itertools.pairwise(taken))


def test_discard_forgets_the_posted_receives() -> None:
    link = RecordingLink()
    r = HeaderReceiver()
    r.receive(link, None)  # type: ignore[arg-type]
    r.discard()
    assert r.posted == 0


def test_a_failed_wait_takes_only_its_own_receive() -> None:
    # A failed wait breaks the direction (no receive follows); the other stays posted
    # until the link closes.
    class Failing(RecordingLink):
        def wait_recv(self, posted: PostedRecv, deadline: float | None) -> None:
            raise TimeoutError("nothing came")

    link = Failing()
    r = HeaderReceiver()
    with pytest.raises(TimeoutError):
        r.receive(link, None)  # type: ignore[arg-type]
    assert r.posted == 1
    assert [e for e, _ in link.events] == ["post", "post"]
