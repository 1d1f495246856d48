"""The one waiter of pair links and N-member groups, against stand-ins for gloo works.

The stand-ins mimic torch's ``Work`` contract (``wait(timeout)`` raises "Operation timed
out!" while not completed and leaves the work usable; a completed work's ``wait``
returns or raises its own failure), so the races can be made to happen every time.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from p2p_collective import CollectiveTimeoutError, PeerError
from p2p_collective._links._waiter import Waiter, gloo_failure, wait_sliced


class _LateWork:
    """Completes while the first wait's slice is running out (the race seen under load)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.completed = False
        self.error = error
        self.waits = 0

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.waits += 1
        if not self.completed:
            self.completed = True  # done a moment after the slice ran out
            raise RuntimeError("Operation timed out!")
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.completed


def test_a_slice_that_runs_out_as_the_work_completes_is_no_failure() -> None:
    work = _LateWork()
    wait_sliced(work, time.monotonic() + 5, lambda: None, "allgather")
    assert work.waits == 2


def test_a_completed_work_still_reports_its_own_failure() -> None:
    work = _LateWork(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="closed by peer"):
        wait_sliced(work, time.monotonic() + 5, lambda: None, "allgather")


def test_a_gone_member_ends_a_sliced_wait() -> None:
    gone = PeerError("member 'b' died")
    with pytest.raises(PeerError, match="died"):
        wait_sliced(_LateWork(), None, lambda: gone, "allreduce")


class _BlockingWork:
    def __init__(self) -> None:
        self.release = threading.Event()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.release.wait(10)
        return True


def test_the_waiter_thread_is_woken_when_the_peer_is_gone() -> None:
    waiter = Waiter("test-wait")
    work = _BlockingWork()
    gone: list[PeerError] = []
    threading.Timer(0.2, lambda: (gone.append(PeerError("peer gone")), waiter.wake())).start()
    t0 = time.monotonic()
    with pytest.raises(PeerError, match="peer gone"):
        waiter.wait(work, None, lambda: gone[0] if gone else None, poll=5.0)
    assert time.monotonic() - t0 < 2.0  # woken, not polled
    work.release.set()
    waiter.wait([_BlockingWork() for _ in range(0)], None, lambda: None)  # usable again
    waiter.close()


def test_gloo_failures_map_to_our_errors() -> None:
    assert isinstance(
        gloo_failure(RuntimeError("Timed out waiting"), "x", "t"), CollectiveTimeoutError
    )
    err = gloo_failure(RuntimeError("Connection reset\nmore"), "recv with peer 'b'", "t")
    assert isinstance(err, PeerError)
    assert str(err) == "recv with peer 'b' failed: Connection reset"
