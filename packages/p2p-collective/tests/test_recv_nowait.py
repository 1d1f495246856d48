"""Receiving from an event loop: ``recv_fileno`` and ``recv_nowait``, between real processes."""

from __future__ import annotations

import nowait_tasks as nt
from conftest import PeerPair


def test_an_event_loop_reader_gets_every_object_in_order(peers: PeerPair, gname: str) -> None:
    sent, (same, counts, info) = peers.run(nt.t_send_all, (gname,), nt.t_read_all, (gname,))
    assert same is True
    if sent != "shm":  # gloo: no descriptor, recv() as always
        assert counts == {"fileno": 0}
        return
    before, refused, transport = info
    assert transport == "shm"
    assert before is None  # not connected before the first receive
    assert "recv_nowait() needs a link with a descriptor" in refused
    # the four larger frames are left to recv(); every other object is taken at once
    assert counts["large"] == 4
    assert counts["nowait"] == len(nt.messages()) - 4


def test_a_peer_that_closes_is_an_error_at_once(peers: PeerPair, gname: str) -> None:
    _, (outcome, elapsed, after, transport) = peers.run(
        nt.t_close_soon, (gname,), nt.t_wait_for_close, (gname,)
    )
    if transport != "shm":
        assert outcome == "no descriptor"
        return
    assert outcome.startswith("PeerError: "), outcome
    assert "peer-a" in outcome
    assert elapsed < 5.0
    assert after in ("PeerGoneError", "GroupBrokenError")
