"""Fault injection with real processes: p2p_collective groups over a TCPStore on 127.0.0.1.

The test process is the survivor. Each case spawns the peers it needs (a victim that is
SIGKILLed, a peer that never reads, a store in a process of its own) and checks which call
fails, with which error type and how long after the fault, and that the survivor keeps
working with its other peers: a long-lived bystander process, on a group created before
the fault and used again after it, and on a group created after it.

Times to error are printed as ``FAULT-TIME {json}`` lines (and appended to
``$P2P_FAULT_TIMES`` when set); docs/operations/failure-matrix.md tabulates them. Bounds
are generous (the CI machine has two busy cores): peer death must be reported within
10 s, a timeout within its configured value plus 5 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from faults import peer as tasks
from faults.harness import (
    PeerProcess,
    StoreHost,
    make_store,
    outcome,
    record_time,
    store_client,
    wait_progress,
)

from p2p_collective import (
    Collective,
    CollectiveConfig,
    CollectiveError,
    CollectiveGroup,
    CollectiveTimeoutError,
    GroupBrokenError,
    PeerError,
)

pytestmark = pytest.mark.timeout(300)

BIG = 64 << 20  # bytes of one large frame
STREAM = 32  # large frames queued at once in the "during" cases (the same tensor each time)
DEATH_BOUND = 10.0  # seconds within which a dead peer must be reported
SLACK = 5.0  # seconds allowed past a configured timeout


@pytest.fixture(scope="module")
def store() -> Any:
    return make_store()


@pytest.fixture(scope="module")
def survivor(store: Any) -> Iterator[Collective]:
    coll = Collective(
        "survivor",
        store_client(store.port),
        config=CollectiveConfig(init_timeout=60.0, op_timeout=120.0),
    )
    yield coll
    coll.close()


@pytest.fixture(scope="module")
def bystander(store: Any, survivor: Collective) -> Iterator[PeerProcess]:
    """A peer that stays alive for the whole module, with a group opened at once."""
    peer = PeerProcess("bystander", store.port)
    echo(survivor, peer, "bystander-main", 2)
    yield peer
    peer.stop()


@pytest.fixture
def gname(request: pytest.FixtureRequest) -> str:
    """A group name unique to the test."""
    return str(request.node.name)


def echo(coll: Collective, peer: PeerProcess, gname: str | None, n: int) -> float:
    """Round-trip ``n`` messages through ``peer``'s echo task; return the seconds it took."""
    t0 = time.monotonic()
    peer.start(tasks.t_echo, coll.name, gname, n)
    g = coll.create_collective_group([coll.name, peer.name], gname)
    for i in range(n):
        msg = {"i": i, "t": torch.full((1000,), i)}
        g.send(msg, timeout=60)
        back = g.recv(timeout=60)
        assert back["i"] == i
        assert torch.equal(back["t"], msg["t"])
    assert peer.result() == n
    return time.monotonic() - t0


def hello(coll: Collective, peer: PeerProcess, gname: str | None) -> CollectiveGroup:
    """Connect both directions of a group with ``peer`` (one small message each way)."""
    peer.start(tasks.t_hello, coll.name, gname)
    g = coll.create_collective_group([coll.name, peer.name], gname)
    sent = g.send({"hello": coll.name}, async_op=True, timeout=60)
    assert g.recv(timeout=60) == {"hello": peer.name}
    sent.wait(timeout=60)
    assert peer.result() == coll.name
    return g


def peer_death(err: BaseException | None) -> bool:
    """Whether ``err`` reports a dead peer: PeerError, or GroupBrokenError caused by one."""
    if isinstance(err, GroupBrokenError):
        err = err.__cause__
    return isinstance(err, PeerError)


def others_keep_working(coll: Collective, bystander: PeerProcess, gname: str) -> None:
    """The survivor still talks to the bystander: on the old group and on a new one."""
    assert echo(coll, bystander, "bystander-main", 3) < 30.0
    assert echo(coll, bystander, f"{gname}.after", 3) < 30.0


# -- a peer killed before, during and after a large transfer ------------------------------


@pytest.mark.parametrize("direction", ["survivor_sends", "survivor_receives"])
@pytest.mark.parametrize("phase", ["before", "during", "after"])
def test_peer_killed_around_a_large_transfer(
    store: Any,
    survivor: Collective,
    bystander: PeerProcess,
    gname: str,
    phase: str,
    direction: str,
) -> None:
    victim = PeerProcess(f"victim.{phase}.{direction}", store.port)
    try:
        g = hello(survivor, victim, gname)
        sends = direction == "survivor_sends"
        data = tasks.big_tensor(BIG)
        works: list[Any] = []
        if phase == "before":
            t0 = victim.kill()
            first = outcome(
                (lambda: g.send(data, timeout=60)) if sends else (lambda: g.recv(timeout=60)), t0
            )
        elif phase == "after":
            if sends:
                victim.start(tasks.t_recv_big, survivor.name, gname, BIG, 1)
                g.send(data, timeout=60)
                assert victim.result() == 1
                t0 = victim.kill()
                first = outcome(lambda: g.send(data, timeout=60), t0)
            else:
                victim.start(tasks.t_send_big, survivor.name, gname, BIG, 1)
                assert torch.equal(g.recv(timeout=60), data)
                assert victim.result() == 1
                pending = g.recv(async_op=True, timeout=60)  # posted before the death
                t0 = victim.kill()
                first = outcome(lambda: pending.wait(timeout=60), t0)
        else:  # during: a stream of large frames, the victim killed after two of them
            if sends:
                victim.start(tasks.t_recv_big, survivor.name, gname, BIG, -1)
                works = [g.send(data, async_op=True, timeout=120) for _ in range(STREAM)]
                wait_progress(store, victim.name, "received", 2)
            else:
                victim.start(tasks.t_send_big, survivor.name, gname, BIG, -1)
                works = [g.recv(async_op=True, timeout=120) for _ in range(STREAM)]
                wait_progress(store, victim.name, "sent", 2)
            t0 = victim.kill()
            ends = [outcome(lambda w=w: w.wait(timeout=60), t0) for w in works]
            failed = [o for o in ends if o.error is not None]
            assert failed, "every queued frame completed although the peer was killed"
            first = failed[0]
            # the frames after the first failure fail fast, caused by it
            for later in failed[1:]:
                assert isinstance(later.error, GroupBrokenError), repr(later.error)
                assert isinstance(later.error.__cause__, PeerError)
            assert max(o.seconds for o in ends) < DEATH_BOUND
        assert victim.proc.exitcode == -9
        call = f"{'send' if sends else 'recv'}()"
        record_time(
            f"peer killed {phase} a 64 MiB transfer ({direction})", call, first.error, first.seconds
        )
        assert isinstance(first.error, PeerError), repr(first.error)
        assert repr(victim.name) in str(first.error)
        assert first.seconds < DEATH_BOUND
        # the failed direction stays broken, naming the first failure
        later = outcome(lambda: g.send("x", timeout=5) if sends else g.recv(timeout=5))
        assert isinstance(later.error, GroupBrokenError)
        assert isinstance(later.error.__cause__, PeerError)
        # the other direction of the group also reports the dead peer, just as fast
        # (PeerError, or GroupBrokenError caused by it when the death was already seen)
        other = outcome(lambda: g.recv(timeout=60) if sends else g.send(data, timeout=60))
        assert peer_death(other.error), repr(other.error)
        assert other.seconds < DEATH_BOUND
        g.close()
        others_keep_working(survivor, bystander, gname)
    finally:
        if victim.proc.is_alive():
            victim.kill()


# -- a peer that never shows up -------------------------------------------------------------


def test_peer_that_never_shows_up_times_out_naming_it(
    store: Any, bystander: PeerProcess, gname: str
) -> None:
    init_timeout = 2.0
    lonely = Collective(
        "lonely",
        store_client(store.port),
        config=CollectiveConfig(init_timeout=init_timeout, op_timeout=60.0),
    )
    try:
        g = lonely.create_collective_group(["lonely", "ghost"])
        for call, fn in (("recv()", lambda: g.recv()), ("send()", lambda: g.send("x"))):
            got = outcome(fn)
            record_time("peer never shows up (init_timeout 2 s)", call, got.error, got.seconds)
            assert isinstance(got.error, CollectiveTimeoutError), repr(got.error)
            assert "'ghost'" in str(got.error)
            assert init_timeout - 0.1 <= got.seconds < init_timeout + SLACK
        # nothing went on the wire: the group is not broken, a shorter op timeout wins
        assert not g.stats()["send"]["broken"]
        assert not g.stats()["recv"]["broken"]
        short = outcome(lambda: g.send("x", timeout=0.5))
        assert isinstance(short.error, CollectiveTimeoutError)
        assert short.seconds < 0.5 + SLACK
        # the same process keeps working with a peer that is there
        assert echo(lonely, bystander, gname, 3) < 30.0
    finally:
        lonely.close()


# -- the rendezvous store going away ----------------------------------------------------------


def test_store_killed_connected_groups_keep_working_pending_rendezvous_fails(
    bystander: PeerProcess, gname: str
) -> None:
    host = StoreHost()
    peer = PeerProcess("storepeer", host.port)
    coll = Collective(
        "survivor2",
        store_client(host.port, timeout=10.0),
        config=CollectiveConfig(init_timeout=30.0, op_timeout=60.0),
    )
    try:
        hello(coll, peer, gname)
        ghost = coll.create_collective_group(["survivor2", "ghost"])
        pending = ghost.recv(async_op=True)  # waiting in the rendezvous for "ghost"
        time.sleep(0.3)
        t0 = host.kill()
        failed = outcome(lambda: pending.wait(timeout=60), t0)
        record_time("store killed during a rendezvous", "recv()", failed.error, failed.seconds)
        assert isinstance(failed.error, CollectiveError), repr(failed.error)
        assert "rendezvous store failed" in str(failed.error)
        assert failed.seconds < DEATH_BOUND
        # a group that is connected needs no store: both directions keep working
        assert echo(coll, peer, gname, 3) < 30.0
        assert echo(coll, peer, gname, 3) < 30.0
    finally:
        coll.close()
        peer.stop()
        if host.proc.is_alive():
            host.kill()


def test_store_killed_then_new_group_fails_within_its_timeouts(bystander: PeerProcess) -> None:
    # The store client's own timeout is long (10 s): the new group's first operation
    # must give up within its op timeout, not the store client's (fixed in b8ee38a: the
    # per-direction store client used to be a TCPStore.clone() made without a deadline).
    host = StoreHost()
    init_timeout = op_timeout = 1.0
    coll = Collective(
        "survivor3",
        store_client(host.port, timeout=10.0),
        config=CollectiveConfig(init_timeout=init_timeout, op_timeout=op_timeout),
    )
    try:
        t0 = host.kill()
        fresh = coll.create_collective_group(["survivor3", "late"])
        got = outcome(lambda: fresh.send("x"), t0)
        record_time("store killed, then a new group's first op", "send()", got.error, got.seconds)
        assert isinstance(got.error, CollectiveError), repr(got.error)
        assert got.seconds < op_timeout + SLACK, got.seconds
    finally:
        coll.close()
        if host.proc.is_alive():
            host.kill()


# -- a receiver that stops reading -------------------------------------------------------------


def test_receiver_that_stops_reading_blocks_the_sender_until_its_op_timeout(
    store: Any, bystander: PeerProcess, gname: str
) -> None:
    op_timeout = 3.0
    sender = Collective(
        "sender",
        store_client(store.port),
        config=CollectiveConfig(init_timeout=60.0, op_timeout=op_timeout),
    )
    lazy = PeerProcess("lazy", store.port)
    try:
        g = hello(sender, lazy, gname)  # the peer answers once, then never reads again
        t0 = time.monotonic()
        big = g.send(tasks.big_tensor(BIG), async_op=True)  # default timeout: op_timeout
        small = g.send({"after": 1}, async_op=True)
        # while the send is stuck, the process talks to another peer as usual
        assert echo(sender, bystander, f"{gname}.other", 2) < 30.0
        first = outcome(lambda: big.wait(timeout=60), t0)
        record_time("receiver stops reading (op_timeout 3 s)", "send()", first.error, first.seconds)
        assert isinstance(first.error, CollectiveTimeoutError), repr(first.error)
        assert op_timeout - 0.1 <= first.seconds < op_timeout + SLACK
        queued = outcome(lambda: small.wait(timeout=60))
        assert isinstance(queued.error, GroupBrokenError)
        assert isinstance(queued.error.__cause__, CollectiveTimeoutError)
        assert queued.seconds < 1.0
        # the documented recovery: close on both sides, re-create the same group
        g.close()
        assert lazy.call(tasks.t_close_group, "sender", gname) is True
        hello(sender, lazy, gname)
    finally:
        sender.close()
        lazy.stop()
