"""The liveness oracle: an operation toward a worker whose actor is dead fails fast.

p2p-collective alone cannot see the death of a peer it never connected to; the
``Collective`` of a worker asks Ray (``is_alive``) while it waits for a peer. Real
embedded Ray cluster, real actors killed with ``ray.kill``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

from p2p_collective import PeerError
from p2p_worker import Cluster, PackedPlacementStrategy, Worker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ONE = PackedPlacementStrategy(1, cpus_per_worker=0)
BOUND = 5.0  # seconds from the call to the PeerError (the bound)


class Waiter(Worker):
    def toward(self, group: str, op: str) -> tuple[str, bool, float, str]:
        """``op`` ("send" or "recv") toward rank 0 of ``group``: outcome, seconds."""
        t0 = time.monotonic()
        try:
            if op == "send":
                self.send({"hello": 1}, dst_group_name=group, dst_rank=0, timeout=60)
            else:
                got = self.recv(src_group_name=group, src_rank=0, timeout=60)
                return ("ok", False, time.monotonic() - t0, repr(got))
            return ("ok", False, time.monotonic() - t0, "")
        except Exception as exc:
            return (type(exc).__name__, isinstance(exc, PeerError), time.monotonic() - t0, str(exc))


class Echo(Worker):
    def echo_once(self, group: str) -> Any:
        obj = self.recv(src_group_name=group, src_rank=0, timeout=60)
        return obj


def test_op_toward_a_killed_actor_never_connected_fails_within_five_seconds(
    cluster: Cluster,
) -> None:
    waiter = Waiter.create_group().launch(cluster, ONE, name="oracle_waiter")
    victim = Echo.create_group().launch(cluster, ONE, name="oracle_victim")
    ray.kill(victim.actors[0], no_restart=True)  # before any link to it existed
    for op in ("recv", "send"):
        [(kind, is_peer_error, seconds, text)] = waiter.toward("oracle_victim", op).wait(120)
        assert is_peer_error, (op, kind, text)
        assert seconds < BOUND, (op, seconds)
        assert "oracle_victim:0" in text
        assert "liveness oracle" in text
    # a fresh worker under the same address: the same waiter now reaches it
    victim.shutdown()
    fresh = Echo.create_group().launch(cluster, ONE, name="oracle_victim")
    echo = fresh.echo_once("oracle_waiter")
    [(kind, _, seconds, text)] = waiter.toward("oracle_victim", "send").wait(120)
    assert kind == "ok", text
    assert echo.wait(120) == [{"hello": 1}]
