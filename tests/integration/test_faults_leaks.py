"""No thread, descriptor or memory leak across 100 failure cycles in one surviving process.

One cycle: create a group with the cycle peer, exchange a message, then the peer closes
its side and the survivor observes the failure -- a pending receive that fails
(``PeerError``), an 8 MiB send into the closed group (``PeerError``), or a receive that times
out first (``CollectiveTimeoutError``), in turn -- and closes its side. The survivor is
this test process. Resources are counted after 10 warm-up cycles and again after 100
more; the growth must stay within:

- Python threads: +2, OS threads: +8, open file descriptors: +16;
- resident memory, counted after a GC and ``malloc_trim(0)`` (see ``harness.resources``):
  +128 MiB in all at every count, and the peak of the last five counts at most 32 MiB
  above the peak of the first five (a retained 8 MiB payload per failed send would add
  ~135 MiB every 50 cycles). Peaks, because single counts swing by up to 50 MiB with no
  trend: the heap holds a varying number of freed payloads (CI once saw +0.8 MiB at
  cycle 50 and +51.8 MiB at cycle 100, with +51.0 MiB already at cycle 40);
- groups cached by the Collective: at most 2.

Two variants: the group re-created under the same key every cycle (the documented way to
recover), and a new key every cycle (what channels do: one group name per link
generation).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from faults import peer as tasks
from faults.harness import PeerProcess, Resources, make_store, resources, store_client

from p2p_collective import (
    Collective,
    CollectiveConfig,
    CollectiveTimeoutError,
    GroupBrokenError,
    PeerError,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WARMUP = 10
CYCLES = 100
BOUND = Resources(python_threads=2, native_threads=8, open_fds=16, rss_bytes=128 << 20)
LATE_RSS_BOUND = 32 << 20  # peak of the second half of the counts over the first half's
MAX_CACHED_GROUPS = 2
FAILED_SEND = 8 << 20  # bytes of the send that fails in every third cycle


@pytest.fixture(scope="module")
def store() -> Any:
    return make_store()


@pytest.fixture
def cycle_peer(store: Any) -> Iterator[PeerProcess]:
    peer = PeerProcess("cyclepeer", store.port)
    yield peer
    peer.stop()


def one_cycle(coll: Collective, store: Any, prefix: str, i: int, same_key: bool) -> str:
    """Run cycle ``i`` on the survivor's side; return the type name of the observed error."""
    g = coll.create_collective_group(
        [coll.name, "cyclepeer"], prefix if same_key else f"{prefix}.{i}"
    )
    msg = {"i": i, "t": torch.full((256,), i)}
    g.send(msg, timeout=60)
    back = g.recv(timeout=60)
    assert back["i"] == i
    assert torch.equal(back["t"], msg["t"])
    go, closed = f"{prefix}/{i}/go", f"{prefix}/{i}/closed"
    kind = i % 3
    err: BaseException | None
    if kind == 0:  # a receive is pending when the peer closes
        pending = g.recv(async_op=True, timeout=60)
        store.set(go, b"1")
        err = pending.exception(timeout=60)
    elif kind == 1:  # a large send into a group the peer has closed
        store.set(go, b"1")
        store.wait([closed], datetime.timedelta(seconds=60))
        try:
            g.send(torch.ones(FAILED_SEND // 4), timeout=60)
            err = None
        except (PeerError, GroupBrokenError) as exc:
            err = exc
    else:  # a receive times out while the peer is still there, then the peer closes
        try:
            g.recv(timeout=0.2)
            err = None
        except CollectiveTimeoutError as exc:
            err = exc
        store.set(go, b"1")
        store.wait([closed], datetime.timedelta(seconds=60))
    g.close()
    assert err is not None, f"cycle {i} (kind {kind}) observed no error"
    if isinstance(err, GroupBrokenError):  # the peer's close was seen before the send
        err = err.__cause__
    expected = CollectiveTimeoutError if kind == 2 else PeerError
    assert isinstance(err, expected), repr(err)
    return type(err).__name__


def check_growth(coll: Collective, base: Resources, done: int) -> Resources:
    now = resources()
    grown = now.minus(base)
    cached = len(coll.groups)
    print(f"after {done} cycles: growth {grown}, {cached} cached groups")
    assert grown.python_threads <= BOUND.python_threads, grown
    assert grown.native_threads <= BOUND.native_threads, grown
    assert grown.open_fds <= BOUND.open_fds, grown
    assert grown.rss_bytes <= BOUND.rss_bytes, grown
    assert cached <= MAX_CACHED_GROUPS, f"{cached} groups cached after {done} cycles"
    return now


@pytest.mark.parametrize("same_key", [True, False], ids=["same_key", "new_key"])
def test_hundred_failure_cycles_leak_nothing(
    store: Any, cycle_peer: PeerProcess, same_key: bool
) -> None:
    prefix = f"cycles.{'same' if same_key else 'new'}"
    coll = Collective(
        "leaksurv",
        store_client(store.port),
        config=CollectiveConfig(init_timeout=60.0, op_timeout=120.0),
    )
    cycle_peer.start(tasks.t_cycles, "leaksurv", prefix, WARMUP + CYCLES, same_key)
    seen: dict[str, int] = {}
    t0 = time.monotonic()
    try:
        for i in range(WARMUP):
            one_cycle(coll, store, prefix, i, same_key)
        base = resources()
        at: dict[int, Resources] = {}
        for i in range(WARMUP, WARMUP + CYCLES):
            name = one_cycle(coll, store, prefix, i, same_key)
            seen[name] = seen.get(name, 0) + 1
            done = i - WARMUP + 1
            if done % 10 == 0:  # fail early, do not wait for the 100th cycle
                at[done] = check_growth(coll, base, done)
        half = CYCLES // 2
        early_peak = max(r.rss_bytes for done, r in at.items() if done <= half)
        late_peak = max(r.rss_bytes for done, r in at.items() if done > half)
        late = late_peak - early_peak
        print(f"RSS peak, last {half} cycles against the first {half}: {late / 2**20:+.1f} MiB")
        assert late <= LATE_RSS_BOUND, late
        assert cycle_peer.result() == WARMUP + CYCLES
    finally:
        coll.close()
    print(f"{CYCLES} cycles in {time.monotonic() - t0:.1f} s, errors observed: {seen}")
    assert seen == {"PeerError": 67, "CollectiveTimeoutError": 33}
