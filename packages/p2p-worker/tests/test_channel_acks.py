"""Acknowledgements that ride on a consumer's next request, or leave alone soon after."""

from __future__ import annotations

import threading
import time

from p2p_worker._channels._client.acks import ACK_DELAY, MAX_TICK, TICK_LINGER, AckBatch, AckFlusher
from p2p_worker._channels._protocol.proto import ACK, ACKED, GET


class _Link:
    """A link's ack side: its batch, flushed as the real link does (under its lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batch = AckBatch()
        self.sent: list[tuple[object, ...]] = []
        self.flushed = threading.Event()

    def flush_acks(self) -> None:
        with self.lock:
            msg = self.batch.alone()
            if msg is not None:
                self.sent.append(msg)
        self.flushed.set()


def test_acks_ride_on_the_next_request_once() -> None:
    batch = AckBatch()
    assert batch.wrap((GET, 0)) == (GET, 0)
    batch.add(0)
    batch.add(1)
    assert batch.wrap((GET, 2)) == (ACKED, (0, 1), (GET, 2))
    assert batch.wrap((GET, 3)) == (GET, 3)  # taken: never sent twice
    assert batch.alone() is None
    batch.add(3)
    batch.clear()  # a reset link: the hello's report covers them
    assert batch.alone() is None


def test_flusher_sends_acks_no_request_took_along() -> None:
    flusher = AckFlusher()
    idle, busy = _Link(), _Link()
    with idle.lock:
        idle.batch.add(7)
    with busy.lock:
        busy.batch.add(8)
    start = time.monotonic()
    flusher.arm(idle)
    flusher.arm(busy)
    with busy.lock:  # busy's next request takes its ack along before the flusher runs
        assert busy.batch.wrap((GET, 9)) == (ACKED, (8,), (GET, 9))
    assert idle.flushed.wait(5.0)
    assert busy.flushed.wait(5.0)
    assert time.monotonic() - start >= ACK_DELAY
    assert idle.sent == [(ACK, 7)]
    assert busy.sent == []
    # armed again later, it flushes again (the thread lives on)
    idle.flushed.clear()
    with idle.lock:
        idle.batch.add(10)
    flusher.arm(idle)
    assert idle.flushed.wait(5.0)
    assert idle.sent == [(ACK, 7), (ACK, 10)]


def test_flusher_ticks_while_armed_often_and_skips_disarmed_links() -> None:
    flusher = AckFlusher()
    link, other = _Link(), _Link()
    flusher.arm(link)  # wakes the thread; it ticks from now on
    assert link.flushed.wait(5.0)
    link.flushed.clear()
    # Armed while ticking (no wake-up needed), then a request takes the ack along:
    # the flusher never calls that link.
    with link.lock:
        link.batch.add(1)
    flusher.arm(link)
    with link.lock:
        assert link.batch.wrap((GET, 2)) == (ACKED, (1,), (GET, 2))
    flusher.disarm(link)
    # Another link armed while ticking is flushed no sooner than ACK_DELAY after its arm.
    with other.lock:
        other.batch.add(3)
    start = time.monotonic()
    flusher.arm(other)
    assert other.flushed.wait(5.0)
    assert time.monotonic() - start >= ACK_DELAY
    assert other.sent == [(ACK, 3)]
    time.sleep(10 * ACK_DELAY)
    assert not link.flushed.is_set()
    assert link.sent == []
    # After TICK_LINGER without an arm the thread sleeps; an arm wakes it again.
    deadline = time.monotonic() + TICK_LINGER + 5.0
    while not flusher._idle and time.monotonic() < deadline:
        time.sleep(ACK_DELAY)
    assert flusher._idle
    with link.lock:
        link.batch.add(4)
    flusher.arm(link)
    assert link.flushed.wait(5.0)
    assert link.sent == [(ACK, 4)]


def test_a_late_tick_flushes_what_is_due_before_the_flusher_goes_idle() -> None:
    # A tick that comes long after the last arm (a loaded machine can delay a thread by
    # more than TICK_LINGER) must still send what is due, not go idle holding it.
    flusher = AckFlusher()
    first, late = _Link(), _Link()
    flusher.arm(first)
    assert first.flushed.wait(5.0)
    deadline = time.monotonic() + 5.0
    while not flusher._idle and time.monotonic() < deadline:  # it goes idle after the linger
        time.sleep(ACK_DELAY)
    assert flusher._idle
    with late.lock:
        late.batch.add(5)
    with flusher._cond:  # what a late tick sees: one link armed long ago, no arm lately
        flusher._armed[late] = flusher._last_arm = time.monotonic() - 10 * TICK_LINGER
        flusher._idle = False
        flusher._cond.notify()
    assert late.flushed.wait(5.0)
    assert late.sent == [(ACK, 5)]


def test_ticks_stretch_while_requests_take_every_ack_and_shorten_once_one_is_left() -> None:
    flusher = AckFlusher()  # never armed through arm(): no thread, _due() driven here
    left = _Link()
    pauses = []
    with flusher._cond:
        for _ in range(6):  # gets flow (recent arms), every ack rode a request
            flusher._last_arm = time.monotonic()
            due, pause = flusher._due()
            assert due == []
            pauses.append(pause)
    assert pauses == [ACK_DELAY, 2 * ACK_DELAY, 4 * ACK_DELAY, MAX_TICK, MAX_TICK, MAX_TICK]
    with flusher._cond:  # an ack no request took along: flushed, and ticks are short again
        flusher._armed[left] = flusher._last_arm = time.monotonic() - ACK_DELAY
        due, pause = flusher._due()
        assert due == [left]
        assert pause == ACK_DELAY
        flusher._last_arm = time.monotonic() - TICK_LINGER  # quiet: idle, and short next time
        assert flusher._due() == ([], None)
        flusher._last_arm = time.monotonic()
        assert flusher._due() == ([], ACK_DELAY)


def test_an_ack_armed_during_a_long_pause_leaves_within_max_tick() -> None:
    flusher = AckFlusher()
    link = _Link()
    flusher.arm(link)
    assert link.flushed.wait(5.0)
    start, stop = time.monotonic(), time.monotonic() + 10.0
    while time.monotonic() < stop:  # a consumer whose requests take every ack along
        flusher.arm(link)
        flusher.disarm(link)
        time.sleep(ACK_DELAY / 2)
        if flusher._tick == MAX_TICK and time.monotonic() - start > 0.1:
            break
    assert flusher._tick == MAX_TICK
    assert link.sent == []
    link.flushed.clear()
    with link.lock:
        link.batch.add(6)
    start = time.monotonic()
    flusher.arm(link)  # left behind: the consumer stopped
    assert link.flushed.wait(5.0)
    took = time.monotonic() - start
    assert took >= ACK_DELAY
    assert took < MAX_TICK + 0.2  # one pause, with room for a loaded machine
    assert link.sent == [(ACK, 6)]
