"""One peer, one fate: a killed peer fails everything toward it within 5 s, everywhere.

Real processes killed with SIGKILL (or ``os._exit``), real gloo / shared memory, over
both transports of the suite (``P2P_TEST_TRANSPORT``). Each test ends with the survivor
working with a fresh incarnation of the killed peer.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import peer_tasks as pt
import pytest
from conftest import make_store

from p2p_collective import (
    Collective,
    CollectiveTimeoutError,
    GroupBrokenError,
    PeerError,
    PeerGoneError,
    create_multi_group,
)
from p2p_collective._peers._peer import announced_instance

pytestmark = pytest.mark.timeout(180)

BOUND = 5.0  # seconds from the kill to the PeerError (the bound)
CTX = mp.get_context("spawn")


def failure(fn: Any, t0: float) -> tuple[BaseException, float]:
    """Run ``fn``; it must raise. Return the error and the seconds since ``t0``."""
    try:
        fn()
    except Exception as exc:
        return exc, time.monotonic() - t0
    raise AssertionError("the operation succeeded although the peer was killed")


def kill(proc: Any) -> float:
    t0 = time.monotonic()
    proc.kill()
    proc.join(timeout=30)
    return t0


def wait_new_instance(store: Any, name: str, old: str | None, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while announced_instance(store, name) in (None, old):
        assert time.monotonic() < end, f"{name!r} never announced a new incarnation"
        time.sleep(0.05)


def fresh_pair_exchange(store: Any, coll: Collective, gname: str) -> None:
    """Start a fresh 'b'; once it announced itself, a new group meets it."""
    old = announced_instance(store, "b")
    results = CTX.Queue()
    fresh = CTX.Process(
        target=pt.pair_fresh, args=(store.port, "b", "a", gname, results), daemon=True
    )
    fresh.start()
    try:
        wait_new_instance(store, "b", old)
        g = coll.create_collective_group(["a", "b"], gname)
        assert not g.peer_gone  # the cached group of the dead peer was replaced
        g.send({"n": 7}, timeout=60)
        assert g.recv(timeout=60) == ("echo", {"n": 7})
        status, value = results.get(timeout=60)
        assert status == "ok", value
    finally:
        fresh.join(timeout=30)
    assert fresh.exitcode == 0


@pytest.mark.parametrize("when", ["recv_waiting", "started_after"])
def test_killed_peer_fails_a_never_used_direction_within_five_seconds(
    when: str, gname: str
) -> None:
    store = make_store()
    coll = Collective("a", pt.client(store.port), timeout=30.0, config=pt.suite_config())
    # recv_waiting: a -> b is used, the recv waits for b -> a to connect when b dies.
    # started_after: b -> a is used; after the kill, a send (never-used a -> b) and a
    # recv (used b -> a) are started.
    first = "recv" if when == "recv_waiting" else "send"
    victim = CTX.Process(
        target=pt.pair_victim, args=(store.port, "b", "a", gname, first), daemon=True
    )
    victim.start()
    try:
        g = coll.create_collective_group(["a", "b"], gname)
        if when == "recv_waiting":
            g.send("hello", timeout=60)
            pending = g.recv(async_op=True, timeout=120)
            time.sleep(0.5)  # the recv is waiting for the never-used direction
            assert not pending.done()
            t0 = kill(victim)
            err, seconds = failure(lambda: pending.wait(timeout=60), t0)
            assert isinstance(err, PeerError), repr(err)
            assert seconds < BOUND, seconds
            assert "'b'" in str(err)
        else:
            assert g.recv(timeout=60) == "hello"
            t0 = kill(victim)
        # operations started after the death, on either direction, fail as fast
        for op in (lambda: g.send("x", timeout=60), lambda: g.recv(timeout=60)):
            err, seconds = failure(op, t0)
            assert isinstance(err, PeerError), repr(err)
            assert seconds < BOUND, seconds
        err, _ = failure(lambda: g.send("y", async_op=True, timeout=60).wait(timeout=60), t0)
        assert isinstance(err, PeerGoneError)
        assert isinstance(err, GroupBrokenError)
        assert isinstance(err.__cause__, PeerError)
        assert g.peer_gone
        # a new group toward the dead peer refuses to wait for it, too
        other = coll.create_collective_group(["a", "b"], gname + ".other")
        err, seconds = failure(lambda: other.recv(timeout=60), t0)
        assert isinstance(err, PeerError), repr(err)
        assert seconds < BOUND + 1.0, seconds
        other.close()
        fresh_pair_exchange(store, coll, gname)
    finally:
        if victim.is_alive():
            victim.kill()
        coll.close()


def test_member_killed_mid_allreduce_fails_every_group_toward_it(gname: str) -> None:
    store = make_store()
    names = ["m0", "m1", "m2"]
    results = [CTX.Queue() for _ in names]
    coll = Collective("m0", pt.client(store.port), timeout=30.0, config=pt.suite_config())
    procs = [
        CTX.Process(
            target=pt.member,
            args=(store.port, n, names, gname, role, results[r]),
            daemon=True,
        )
        for r, n, role in ((1, "m1", "survivor"), (2, "m2", "victim"))
    ]
    for p in procs:
        p.start()
    try:
        g = create_multi_group(coll, names, gname)
        t = pt.torch.ones(4)
        g.allreduce(t, timeout=60)
        assert t.tolist() == [3.0] * 4
        # a pair group with the victim, connected through the group's fate only
        pair = coll.create_collective_group(["m0", "m2"], gname + ".pair")
        t0 = time.monotonic()
        err, _ = failure(lambda: g.allreduce(pt.torch.ones(1 << 16), timeout=120), t0)
        seconds = time.monotonic() - t0 - 0.5  # the victim dies 0.5 s after its allreduce
        assert isinstance(err, PeerError), repr(err)  # gloo's own error, or the watch's
        assert seconds < BOUND, seconds
        later, _ = failure(lambda: g.barrier(timeout=60), t0)
        assert isinstance(later, PeerGoneError), repr(later)
        # every group toward the victim shares its fate, even one that never connected
        err, seconds = failure(lambda: pair.send("x", timeout=60), t0)
        assert isinstance(err, PeerError), repr(err)
        assert "'m2'" in str(err)
        assert seconds < BOUND + 0.5, seconds
        procs[1].join(timeout=30)
        assert procs[1].exitcode == 3
        status, out = results[1].get(timeout=60)
        assert status == "ok", out
        assert out["first"] == "PeerError", out
        assert out["seconds"] < BOUND + 0.5, out
        assert out["later"] == "PeerGoneError", out
        assert out["later_seconds"] < 1.0, out
        # a fresh m2 joins the re-created group
        g.close()
        fresh = CTX.Process(
            target=pt.member,
            args=(store.port, "m2", names, gname, "fresh", results[2]),
            daemon=True,
        )
        fresh.start()
        procs.append(fresh)
        g = create_multi_group(coll, names, gname)
        t = pt.torch.full((3,), 1.0)
        pt.retry_while_gone(lambda: g.allreduce(t, timeout=60))
        assert t.tolist() == [6.0] * 3
        for r in (1, 2):
            status, out = results[r].get(timeout=60)
            assert status == "ok", out
            assert out["after"] == [6.0] * 3
    finally:
        for q in results[1:]:
            while not q.empty():
                print("member result:", q.get())
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        coll.close()


def test_oracle_fails_a_wait_for_a_peer_that_never_came_and_the_group_stays_usable() -> None:
    store = make_store()
    verdict = {"ghost": False}
    asked: list[str] = []

    def is_alive(name: str) -> bool:
        asked.append(name)
        return verdict.get(name, True)

    coll = Collective("a", pt.client(store.port), timeout=30.0, is_alive=is_alive)
    try:
        g = coll.create_collective_group(["a", "ghost"])
        t0 = time.monotonic()
        with pytest.raises(PeerError, match="liveness oracle") as info:
            g.recv(timeout=60)
        assert time.monotonic() - t0 < BOUND
        assert "'ghost'" in str(info.value)
        assert asked == ["ghost"]
        # nothing went on the wire: once the oracle says alive, the group waits as usual
        verdict["ghost"] = True
        time.sleep(1.1)  # the oracle is asked at most once a second per peer
        with pytest.raises(CollectiveTimeoutError):
            g.recv(timeout=0.5)
    finally:
        coll.close()


def test_is_alive_must_be_callable() -> None:
    store = make_store()
    with pytest.raises(TypeError, match="is_alive: expected a callable"):
        Collective("a", store, is_alive=True)  # type: ignore[arg-type]
    coll = Collective("a", store, is_alive=lambda name: True)  # the same name works after
    coll.close()
