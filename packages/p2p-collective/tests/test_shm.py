"""Same-node shared-memory links (issue 14), between real spawned processes."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import time

import pytest
import shm_tasks as st
from collective_tasks import PeerContext
from conftest import PeerPair, make_store

from p2p_collective import GroupBrokenError, PeerError

if os.environ.get("P2P_TEST_TRANSPORT", "shm") == "gloo":
    pytest.skip("P2P_TEST_TRANSPORT=gloo: the suite runs over gloo", allow_module_level=True)

SHM = ("shm", "")
MIB = 1 << 20


def test_every_payload_kind_goes_through_shared_memory_with_exact_values(
    peers: PeerPair, gname: str
) -> None:
    a, b = peers.run(st.t_exchange_payloads, (gname,), st.t_exchange_payloads, (gname,))
    for bad, transports in (a, b):
        assert bad == []
        assert transports == {"send": SHM, "recv": SHM}


@pytest.mark.timeout(300)
def test_a_512_mib_tensor(peers: PeerPair, gname: str) -> None:
    n = 512 * MIB
    (elapsed, sent), (same, got) = peers.run(
        st.t_big_send, (gname, n), st.t_big_recv, (gname, n), timeout=280
    )
    assert same is True
    assert sent == got == SHM
    print(f"512 MiB through shared memory in {elapsed:.2f} s")


def test_many_concurrent_async_sends_arrive_in_order(peers: PeerPair, gname: str) -> None:
    sent, (got, recv_t) = peers.run(st.t_async_sends, (gname, 60), st.t_async_recvs, (gname, 60))
    assert got == list(range(60))
    assert sent == recv_t == SHM


def test_compressed_payloads_travel_through_shared_memory(peers: PeerPair, gname: str) -> None:
    (ok_a, out_a, tr_a), (ok_b, out_b, tr_b) = peers.run(
        st.t_compressed, (gname,), st.t_compressed, (gname,)
    )
    assert ok_a
    assert ok_b
    assert out_a == (2, True)  # both tensors compressed, fewer bytes on the wire
    assert out_b == (2, "shm")
    assert tr_a["send"] == tr_b["recv"] == SHM


# 200 KiB: the header and the payload inline in one sendmsg; 1 MiB: the header with the
# payload's first control record once chunk 0 is in its slot; 24 MiB: twelve chunks
@pytest.mark.parametrize("nbytes", [200 * 1024, MIB + 8, 24 * MIB + 8])
def test_send_tensor_lands_in_the_preallocated_tensor(
    peers: PeerPair, gname: str, nbytes: int
) -> None:
    sent, (same_buf, equal, got) = peers.run(
        st.t_send_tensor, (gname, nbytes), st.t_send_tensor, (gname, nbytes)
    )
    assert same_buf
    assert equal
    assert sent == got == SHM


@pytest.mark.parametrize("mine", [False, True])
def test_disabled_by_config_falls_back_to_gloo_on_both_sides(
    peers: PeerPair, gname: str, mine: bool
) -> None:
    tag = f"cfg{int(mine)}"
    # peer-a has shared_memory off; peer-b has it ``mine``: off on either side means gloo
    (ok_a, tr_a), (ok_b, tr_b) = peers.run(st.t_disabled, (tag, False), st.t_disabled, (tag, mine))
    assert ok_a
    assert ok_b
    gloo = ("gloo", "disabled by config")
    assert tr_a == tr_b == {"send": gloo, "recv": gloo}


def test_peer_on_another_host_falls_back_to_gloo_and_says_why(peers: PeerPair, gname: str) -> None:
    a, b = peers.run(st.t_other_host, (gname,), st.t_other_host, (gname,))
    assert a["send"] == b["recv"] == ("gloo", "peer on another host")
    assert a["recv"] == (None, "not connected yet")


@pytest.mark.parametrize("recv_bytes", [512 * 1024, 0], ids=["recv_tensor", "recv"])
def test_a_message_longer_than_the_receive_is_a_framing_error(
    peers: PeerPair, gname: str, recv_bytes: int
) -> None:
    # the send_tensor header names the size: the receiver refuses it before any payload
    # moves, and hangs up, so the sender's pending send fails at once
    sent, (outcome, elapsed) = peers.run(
        st.t_mismatch_send, (gname, MIB), st.t_mismatch_recv, (gname, recv_bytes)
    )
    assert outcome.startswith("FramingError: ")
    if recv_bytes:
        assert "tensor of 524288 bytes but 'peer-a' sent 1048576 bytes" in outcome
    else:
        assert "comes from send_tensor() where this side called recv()" in outcome
    assert elapsed < 10
    assert sent == "PeerError"  # the receiver shut the channel: no hang until the deadline


def test_peer_killed_mid_transfer_fails_fast_and_leaves_nothing() -> None:
    shm_before = set(os.listdir("/dev/shm"))
    store = make_store()
    proc = mp.get_context("spawn").Process(
        target=st.die_mid_big_send, args=(0, store.port, 64 * MIB), daemon=True
    )
    proc.start()
    try:
        ctx = PeerContext(1, store.port)
        baseline = st.fd_count()
        kinds = st.fd_kinds()
        g = ctx.group("shm-death")
        assert g.recv(timeout=60) == "ready"
        assert g.stats()["recv"]["transport"] == "shm"
        assert st.shm_fds() != []  # the segment is mapped while the group is open
        ctx.barrier("shm-death")
        t0 = time.monotonic()
        err = st.recv_until_error(g)
        elapsed = time.monotonic() - t0
        assert isinstance(err, PeerError), repr(err)
        assert elapsed < 5.0, elapsed
        assert "peer-a" in str(err)
        with pytest.raises(GroupBrokenError):
            g.recv(timeout=5)
        ctx.collective.close()
        del g, err
        gc.collect()
        assert st.settle(lambda: st.shm_fds() == []), st.shm_fds()
        assert st.settle(lambda: st.fd_count() <= baseline), sorted(
            set(st.fd_kinds().items()) ^ set(kinds.items())
        )
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 3
    # Python's multiprocessing names its semaphores sem.mp-*; any other process on the
    # machine (another test run) may be making them right now. Ours would be anything else.
    new = set(os.listdir("/dev/shm")) - shm_before
    assert {n for n in new if not n.startswith("sem.mp-")} == set()
