"""Failure semantics: desync, timeouts, close, a peer that dies or never comes."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import pickle
import threading
import time

import collective_tasks as ct
import pytest
import torch
from conftest import PeerPair, make_store

from p2p_collective import (
    Collective,
    CollectiveError,
    CollectiveTimeoutError,
    FramingError,
    GroupBrokenError,
    GroupClosedError,
    PeerError,
    PeerGoneError,
)

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(
    "mode",
    [
        "send_tensor_vs_recv",
        # a send_tensor larger than a header message answered by recv: every operation
        # starts with a header-sized message, so this is a FramingError, not a gloo abort
        "large_send_tensor_vs_recv",
        "send_vs_small_recv_tensor",
        "send_vs_large_recv_tensor",
        # sizes travel in the send_tensor header: a mismatch is caught either way
        "send_tensor_longer",
        "send_tensor_shorter",
    ],
)
def test_unpaired_calls_raise_framing_error_and_break_the_direction(
    peers: PeerPair, gname: str, mode: str
) -> None:
    sent, out = peers.run(
        ct.t_mismatch_sender, (gname, mode), ct.t_mismatch_receiver, (gname, mode)
    )
    payload_times_out = (
        "send_vs_large_recv_tensor",
        "large_send_tensor_vs_recv",
        "send_tensor_longer",
    )
    outcome, elapsed = sent
    assert outcome == ("PeerError" if mode in payload_times_out else "ok")
    assert elapsed < 15
    assert out[0].startswith("FramingError: ")
    if mode in ("send_tensor_vs_recv", "large_send_tensor_vs_recv"):
        assert "send_tensor() where this side called recv()" in out[0]
    elif mode == "send_tensor_longer":
        assert "tensor of 200000 bytes but 'peer-a' sent 300000 bytes" in out[0]
    elif mode == "send_tensor_shorter":
        assert "tensor of 200000 bytes but 'peer-a' sent 100 bytes" in out[0]
    else:
        assert "the peer called send() instead of send_tensor()" in out[0]
    assert out[1:] == [
        "GroupBrokenError cause=FramingError",
        "async: GroupBrokenError",
        "stats broken=True",
    ]


def test_receive_timeout_breaks_only_that_direction(peers: PeerPair, gname: str) -> None:
    out, got = peers.run(ct.t_recv_timeout, (gname,), ct.t_timeout_peer, (gname,))
    assert out[0].startswith("timeout after 1.")
    assert out[0].endswith("CollectiveTimeoutError")
    assert out[1] == "broken cause=CollectiveTimeoutError"
    assert got == "still fine"


def test_close_fails_queued_operations_and_the_peers_pending_receive(
    peers: PeerPair, gname: str
) -> None:
    a, b = peers.run(ct.t_close_with_pending, (gname,), ct.t_close_with_pending, (gname,))
    assert a == ["PeerError", "True"]
    # the first queued receive was still waiting for the peer to join: cancelled cleanly
    assert b == [
        "CollectiveError",
        "GroupClosedError",
        "GroupClosedError",
        "GroupClosedError on send",
        "True",
    ]


def recv_until_error(group: object) -> BaseException:
    while True:
        try:
            group.recv(timeout=60)  # type: ignore[attr-defined]
        except Exception as exc:
            return exc


def test_group_closed_and_recreated_on_both_sides_works_again(peers: PeerPair, gname: str) -> None:
    a, b = peers.run(ct.t_recreate, (gname,), ct.t_recreate, (gname,))
    assert a == ["from peer-b", "again from peer-b", 2]
    assert b == ["again from peer-a", 2]


def test_peer_killed_in_the_middle_of_a_receive_fails_within_ten_seconds() -> None:
    store = make_store()
    proc = mp.get_context("spawn").Process(
        target=ct.die_mid_send, args=(0, store.port, 64 * 1024 * 1024), daemon=True
    )
    proc.start()
    try:
        ctx = ct.PeerContext(1, store.port)
        g = ctx.group("death")
        assert g.recv(timeout=60) == "ready"
        ctx.barrier("death")
        t0 = time.monotonic()
        err = recv_until_error(g)
        elapsed = time.monotonic() - t0
        assert isinstance(err, PeerError), repr(err)
        assert elapsed < 10.0, elapsed
        assert "peer-a" in str(err)
        with pytest.raises(GroupBrokenError) as broken:
            g.recv(timeout=5)
        assert isinstance(broken.value.__cause__, PeerError)
        ctx.collective.close()
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 3


def test_peer_that_never_shows_up_times_out_naming_it_and_a_late_peer_still_connects() -> None:
    store = make_store()
    coll = Collective("early", store, timeout=0.5)
    group = coll.create_collective_group(["early", "late"])
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        group.recv()
    assert time.monotonic() - t0 < 5.0
    assert "'late'" in str(info.value)
    assert not group.stats()["recv"]["broken"]  # nothing was on the wire: retry is fine
    with pytest.raises(CollectiveTimeoutError):
        group.send("x", timeout=0.3)

    late = Collective("late", store, timeout=30.0)
    other = late.create_collective_group(["late", "early"])
    sender = threading.Thread(target=lambda: other.send({"hello": torch.arange(3)}))
    sender.start()
    # "early" waits only 0.5 s for a peer: let "late" announce itself first
    store.wait(["p2p/early+late/1/1to0/send"], datetime.timedelta(seconds=30))
    got = group.recv(timeout=30)
    sender.join(timeout=30)
    assert torch.equal(got["hello"], torch.arange(3))
    reply = threading.Thread(target=lambda: other.recv(timeout=30))
    reply.start()
    store.wait(["p2p/early+late/1/0to1/recv"], datetime.timedelta(seconds=30))
    group.send("back", timeout=30)
    reply.join(timeout=30)
    coll.close()
    late.close()
    with pytest.raises(GroupClosedError):
        coll.create_collective_group(["early", "late"])


def test_two_collectives_in_one_process_exchange_both_ways_with_a_duck_typed_store() -> None:
    server = make_store()

    class DictLikeStore:
        """A store that is not a torch Store: it forwards to a TCPStore client."""

        def __init__(self) -> None:
            self.inner = torch.distributed.TCPStore(
                "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30)
            )
            self.lock = threading.Lock()

        def set(self, key: str, value: bytes) -> None:
            with self.lock:
                self.inner.set(key, value)

        def get(self, key: str) -> bytes:
            with self.lock:
                return bytes(self.inner.get(key))

        def add(self, key: str, amount: int) -> int:
            with self.lock:
                return int(self.inner.add(key, amount))

        def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
            deadline = time.monotonic() + timeout.total_seconds()
            while True:
                with self.lock:
                    if self.inner.check(keys):
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"keys {keys} did not appear")
                time.sleep(0.005)

    a = Collective("a", DictLikeStore())
    b = Collective("b", DictLikeStore())
    ga = a.create_collective_group(["a", "b"])
    gb = b.create_collective_group(["b", "a"])
    assert (ga.rank, gb.rank) == (0, 1)
    works = [ga.send({"i": i, "t": torch.full((3,), i)}, async_op=True) for i in range(20)]
    back = [gb.send(torch.arange(i + 1), async_op=True) for i in range(20)]
    for i in range(20):
        d = gb.recv(timeout=30)
        assert d["i"] == i
        assert torch.equal(d["t"], torch.full((3,), i))
        assert torch.equal(ga.recv(timeout=30), torch.arange(i + 1))
    for w in works + back:
        w.wait(timeout=30)
    a.close()
    b.close()


@pytest.mark.parametrize(
    "cls",
    [
        CollectiveError,
        FramingError,
        CollectiveTimeoutError,
        PeerError,
        PeerGoneError,
        GroupBrokenError,
        GroupClosedError,
    ],
)
def test_errors_pickle_with_message_and_cause(cls: type[CollectiveError]) -> None:
    try:
        try:
            raise RuntimeError("root cause")
        except RuntimeError as root:
            raise cls("what went wrong") from root
    except CollectiveError as exc:
        err = exc
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == "what went wrong"
    assert isinstance(back.__cause__, RuntimeError)
    assert str(back.__cause__) == "root cause"
    if cls is CollectiveTimeoutError:
        assert isinstance(back, TimeoutError)
