"""When the next header receive is posted: by a send, by the next receive, or by the poster.

In-process, with a recording link: these pin the bookkeeping (one post per armed
receive, never two, none after close). test_header_posting.py checks the behaviour
between real processes over both transports.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from p2p_collective._headers import _IDLE_TICKS, POST_DELAY, HeaderPoster, HeaderReceiver
from p2p_collective._recvpool import PostedRecv

pytestmark = pytest.mark.timeout(60)


class RecordingLink:
    """Posts are recorded; a wait "receives" a header into the posted buffer."""

    peer = "peer"
    transport = "gloo"
    transport_reason = ""

    def __init__(self, posts_cost: bool = True) -> None:
        self.posts_cost = posts_cost
        self.posts: list[tuple[str, torch.Tensor]] = []
        self.lock = threading.Lock()

    def post_recv(self, tensor: torch.Tensor) -> PostedRecv:
        with self.lock:
            self.posts.append((threading.current_thread().name, tensor))
        return PostedRecv(object(), tensor)

    def wait_recv(self, posted: PostedRecv, deadline: float | None) -> None:
        posted.tensor[:4] = torch.tensor(list(b"P2PF"), dtype=torch.uint8)


@pytest.fixture
def poster() -> Any:
    p = HeaderPoster("test")
    yield p
    p.close()


def until(cond: Any, limit: float = 5.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit, "condition not reached"
        time.sleep(0.0005)
    return time.monotonic() - t0


def test_the_next_receive_posts_when_nothing_is_posted(poster: HeaderPoster) -> None:
    link = RecordingLink()
    r = HeaderReceiver(poster)
    buf, view = r.receive(link, None)  # type: ignore[arg-type]
    assert len(link.posts) == 1
    assert link.posts[0][1] is buf
    assert bytes(view[:4]) == b"P2PF"
    buf2, _ = r.receive(link, None)  # type: ignore[arg-type]
    assert buf2 is not buf  # the two buffers alternate
    assert len(link.posts) == 2


def test_a_send_posts_the_armed_receive_at_once_and_only_once(poster: HeaderPoster) -> None:
    link = RecordingLink()
    r = HeaderReceiver(poster)
    first, _ = r.receive(link, None)  # type: ignore[arg-type]
    r.arm(link)  # type: ignore[arg-type]
    assert r.is_armed
    assert len(link.posts) == 1
    r.post_armed()  # what the other direction's send does once its message is handed over
    assert not r.is_armed
    assert len(link.posts) == 2
    assert link.posts[1][0] == threading.current_thread().name
    assert link.posts[1][1] is not first  # into the other buffer
    time.sleep(5 * POST_DELAY)
    assert len(link.posts) == 2  # the poster found nothing left to post
    second, _ = r.receive(link, None)  # type: ignore[arg-type]
    assert second is link.posts[1][1]
    assert len(link.posts) == 2


def test_the_poster_posts_an_armed_receive_after_the_delay(poster: HeaderPoster) -> None:
    link = RecordingLink()
    r = HeaderReceiver(poster)
    r.receive(link, None)  # type: ignore[arg-type]
    t0 = time.monotonic()
    r.arm(link)  # type: ignore[arg-type]
    until(lambda: len(link.posts) == 2)
    took = time.monotonic() - t0
    assert POST_DELAY <= took < 0.25, took
    assert link.posts[1][0] == "p2p-post[test]"
    time.sleep(5 * POST_DELAY)
    assert len(link.posts) == 2


def test_a_free_post_is_made_at_once_without_the_poster(poster: HeaderPoster) -> None:
    link = RecordingLink(posts_cost=False)  # shared memory: posting costs nothing
    r = HeaderReceiver(poster)
    r.receive(link, None)  # type: ignore[arg-type]
    r.arm(link)  # type: ignore[arg-type]
    assert len(link.posts) == 2
    assert not r.is_armed


def test_nothing_is_posted_after_discard(poster: HeaderPoster) -> None:
    link = RecordingLink()
    r = HeaderReceiver(poster)
    r.receive(link, None)  # type: ignore[arg-type]
    r.arm(link)  # type: ignore[arg-type]
    r.discard()
    time.sleep(10 * POST_DELAY)
    r.post_armed()
    r.arm(link)  # type: ignore[arg-type]
    assert len(link.posts) == 1


def test_the_poster_sleeps_when_quiet_and_wakes_for_the_next_arm(poster: HeaderPoster) -> None:
    link = RecordingLink()
    receivers = [HeaderReceiver(poster) for _ in range(3)]
    for r in receivers:
        r.receive(link, None)  # type: ignore[arg-type]
        r.arm(link)  # type: ignore[arg-type]
    until(lambda: len(link.posts) == 6)
    until(lambda: poster._idle, limit=5.0 + _IDLE_TICKS * POST_DELAY * 20)
    for r in receivers:
        r.receive(link, None)  # type: ignore[arg-type]
    r = receivers[1]
    r.arm(link)  # type: ignore[arg-type]
    assert not poster._idle  # woken by the arm
    until(lambda: len(link.posts) == 7)
    assert link.posts[-1][0] == "p2p-post[test]"


def test_a_closed_poster_leaves_armed_receives_to_the_next_receive() -> None:
    poster = HeaderPoster("closed")
    link = RecordingLink()
    r = HeaderReceiver(poster)
    r.receive(link, None)  # type: ignore[arg-type]
    poster.close()
    r.arm(link)  # type: ignore[arg-type]
    time.sleep(10 * POST_DELAY)
    assert len(link.posts) == 1
    assert r.is_armed
    r.receive(link, None)  # type: ignore[arg-type]
    assert len(link.posts) == 2
    assert not r.is_armed
