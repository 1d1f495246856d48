"""A producer's answered puts are never left unprocessed, and a reset link fails them.

A process processes its puts' answers in issue order, one thread at a time (the put
*turn*). Threads that hold the turn without processing answers -- a put with a credit,
the linger that hands idle credits back, close -- used to leave an answer that arrived
meanwhile in the inbox until the next answer came; the last answer of a burst then never
got its payload sent, the channel worker reset the link after its transfer timeout, and
the producer, with nothing pending on the link, waited forever (seen once in
bench_channel). These tests hold the put turn from the producer's own thread, as those
holders do, while the answers arrive; a real channel worker, real worker processes and a
real local Ray cluster.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from channel_helpers import channel_actor, wait_for

from p2p_worker import ChannelEmpty, Cluster, NodePlacementStrategy, Worker, create_channel

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)
PEER = "turn_parker:0"


class Parker(Worker):
    """A producer that leaves async puts waiting and holds its put turn on request."""

    def park_puts(self, name: str, values: list[int]) -> None:
        """Issue async puts of ``torch.full((4,), v)`` (tensors: the payload path)."""
        ch = self.connect_channel(name)
        self._works = [ch.put(torch.full((4,), float(v)), async_op=True) for v in values]

    def hold_turn(self, name: str) -> None:
        """Take the put turn of this process's link to ``name`` and keep it."""
        self._turn = self.connect_channel(name)._link()._order["put"]
        self._turn.__enter__()

    def answered(self) -> bool:
        """Whether the channel worker's answers to the parked puts have all arrived."""
        return all(w.ref.done() for w in self._works)  # ``ref``: the answer's future

    def release_turn(self) -> None:
        self._turn.__exit__(None, None, None)

    def outcomes(self, timeout: float) -> list[str]:
        """How the parked puts ended within ``timeout`` s each: "ok" or the error's type."""
        out = []
        for w in self._works:
            try:
                w.wait(timeout)
                out.append("ok")
            except Exception as exc:
                out.append(type(exc).__name__)
        return out

    def put_one(self, name: str, value: int) -> None:
        self.connect_channel(name).put(torch.full((4,), float(value)), timeout=30)


@pytest.fixture(scope="module")
def cluster(ray_session: object) -> Iterator[Cluster]:
    """One job for the module; its producer serves every test (each on its own channel)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = Cluster(num_nodes=1)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def parker(cluster: Cluster) -> Any:
    return Parker.create_group().launch(cluster, ONE, name="turn_parker")


def _value(item: Any) -> float:
    assert isinstance(item, torch.Tensor), item
    assert item.shape == (4,)
    assert torch.equal(item, torch.full((4,), item[0].item()))
    return float(item[0])


def _grant_while_turn_held(cluster: Cluster, parker: Any, name: str) -> Any:
    """A full channel, two parked puts; their grants arrive while the put turn is held."""
    ch = create_channel(cluster, name, maxsize=2, transfer_timeout=20.0)
    ch.put("a")
    ch.put("b")  # full
    parker.park_puts(name, [1, 2]).wait(60)
    wait_for(lambda: ch.stats()["waiting_putters"] == 2)
    parker.hold_turn(name).wait(60)
    assert [ch.get(timeout=30) for _ in range(2)] == ["a", "b"]  # room: both granted
    wait_for(lambda: parker.answered().wait(60) == [True])
    return ch


def test_answers_that_came_while_the_put_turn_was_held_are_processed(
    cluster: Cluster, parker: Any
) -> None:
    ch = _grant_while_turn_held(cluster, parker, "turn_held")
    parker.release_turn().wait(60)  # the holder lets go: it processes what came meanwhile
    assert parker.outcomes(10.0).wait(60) == [["ok", "ok"]]
    assert [_value(ch.get(timeout=30)) for _ in range(2)] == [1.0, 2.0]
    st = ch.stats()
    assert (st["resets"], st["failures"], st["queued"]) == (0, 0, 0)
    ch.destroy()


def test_puts_answered_before_a_link_reset_fail_within_seconds(
    cluster: Cluster, parker: Any
) -> None:
    """The link is reset after the grants arrived, before their payloads could leave."""
    ch = _grant_while_turn_held(cluster, parker, "turn_reset")
    gen = ch.stats()["peers"][PEER]
    ray.get(channel_actor("turn_reset").reset_link.remote(PEER, gen), timeout=30)
    assert ch.stats()["peers"][PEER] == gen + 1
    start = time.monotonic()
    parker.release_turn().wait(60)
    assert parker.outcomes(10.0).wait(60) == [["ChannelError", "ChannelError"]]
    assert time.monotonic() - start < 10.0
    wait_for(lambda: ch.stats()["held"] == 0)  # the granted slots came back
    with pytest.raises(ChannelEmpty):  # nothing was put
        ch.get_nowait()
    parker.put_one("turn_reset", 3).wait(60)  # the next put reconnects
    assert _value(ch.get(timeout=30)) == 3.0
    ch.destroy()


def test_puts_waiting_for_room_fail_within_seconds_when_the_link_is_reset(
    cluster: Cluster, parker: Any
) -> None:
    ch = create_channel(cluster, "turn_waiting", maxsize=1, transfer_timeout=20.0)
    ch.put("a")  # full
    parker.park_puts("turn_waiting", [1, 2]).wait(60)
    wait_for(lambda: ch.stats()["waiting_putters"] == 2)
    gen = ch.stats()["peers"][PEER]
    start = time.monotonic()
    ray.get(channel_actor("turn_waiting").reset_link.remote(PEER, gen), timeout=30)
    assert parker.outcomes(10.0).wait(60) == [["ChannelError", "ChannelError"]]
    assert time.monotonic() - start < 10.0
    assert ch.get(timeout=30) == "a"
    with pytest.raises(ChannelEmpty):
        ch.get_nowait()
    parker.put_one("turn_waiting", 3).wait(60)
    assert _value(ch.get(timeout=30)) == 3.0
    ch.destroy()
