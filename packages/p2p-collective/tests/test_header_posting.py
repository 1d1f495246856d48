"""The next header's receive is posted ahead, so a small send never waits for a receiver.

From its first receive on, a direction keeps two header receives posted (headers travel
under their own gloo tag) and tops them up before each wait, so while an operation runs
and after it, the next header's receive is posted. So a small send completes while the
receiver is busy elsewhere, and two peers that both send before they receive do not
deadlock (gloo only moves a message into a posted receive). Runs over shared memory (the
default transport) and over gloo (``P2P_TEST_TRANSPORT=gloo``).
"""

from __future__ import annotations

import collective_tasks as ct
import pytest
from conftest import PeerPair

pytestmark = pytest.mark.timeout(120)


def test_both_peers_send_before_they_receive(peers: PeerPair, gname: str) -> None:
    rounds = 300
    got_a, got_b = peers.run(
        ct.t_send_first, (gname, rounds), ct.t_send_first, (gname, rounds), timeout=60
    )
    assert got_a == [{"from": "peer-b", "i": i} for i in range(rounds)]
    assert got_b == [{"from": "peer-a", "i": i} for i in range(rounds)]


def test_a_small_send_to_a_busy_receiver_does_not_wait_for_it(peers: PeerPair, gname: str) -> None:
    took, (first, second) = peers.run(
        ct.t_send_to_busy, (gname,), ct.t_reply_then_busy, (gname, 1.5)
    )
    assert (first, second) == ("first", "second")
    assert took < 0.5, took  # not the 1.3 s the receiver stays away


def test_both_peers_sending_first_on_a_new_group_get_an_error_that_says_why(
    peers: PeerPair, gname: str
) -> None:
    # Each direction connects at its first operation, and a send's connection waits for
    # the peer's receiving side: on a brand-new group two sends wait for each other.
    (out_a, got_a), (out_b, got_b) = peers.run(
        ct.t_both_send_first_on_a_new_group,
        (gname,),
        ct.t_both_send_first_on_a_new_group,
        (gname,),
        timeout=90,
    )
    for out in (out_a, out_b):
        assert "did not join" in out
        assert "within 2." in out or "within 1.9" in out
        assert "both send first on a new group" in out
    assert got_a == got_b == "after"
