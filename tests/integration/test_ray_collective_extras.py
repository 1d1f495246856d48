"""What ``p2p_worker.compat`` does beyond ``ray.util.collective``, between plain Ray actors.

A member killed while the others wait in an operation, or before any link to it existed,
fails them with ``PeerError`` within seconds (Ray's gloo backend waits for its 30-minute
timeout); every operation takes ``timeout=``; ``send``/``recv`` between members on one
node go through shared memory; the same group name in another Ray job and namespace
never meets this one; groups may be initialized in any order, the driver may be a
member, and the handle gives the p2p group for asynchronous calls.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import ray.cloudpickle
import torch
from plain_ray import Member, fresh_members, plain_local_ray

import p2p_worker.compat as col
from p2p_collective import CollectiveTimeoutError, PeerError

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

CALL_TIMEOUT = 90.0
DEATH_BOUND = 5.0  # seconds from a member's death to the others' PeerError (the target)


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    """A plain embedded Ray on loopback for this module (``ray.init``, no p2p Cluster)."""
    with plain_local_ray(sys.modules[__name__]):
        yield


@pytest.fixture
def members(ray_up: None) -> Iterator[list[Any]]:
    """Three fresh member actors, killed afterwards."""
    with fresh_members(3) as team:
        yield team


@pytest.fixture(scope="module")
def pair(ray_up: None) -> list[Any]:
    """Two member actors shared by the tests of this module (each uses its own names)."""
    return [Member.remote() for _ in range(2)]


def on(team: list[Any], fn: Any, *args: Any) -> list[Any]:
    return ray.get(  # type: ignore[no-any-return]
        [m.run.remote(fn, rank, *args) for rank, m in enumerate(team)], timeout=CALL_TIMEOUT
    )


def _join(rank: int, world_size: int, name: str) -> float:
    col.init_collective_group(world_size, rank, "gloo", name)
    t = torch.ones(1)
    col.allreduce(t, name, timeout=60)  # connected
    return t.item()


def _wait_for_death(rank: int, name: str) -> tuple[str, bool, bool, float]:
    try:
        col.allreduce(torch.ones(1), name, timeout=60)
    except Exception as exc:
        return (
            type(exc).__name__,
            isinstance(exc, PeerError),
            isinstance(exc, RuntimeError),
            time.time(),
        )
    return "no error", False, False, time.time()


def _regroup(rank: int) -> float:
    col.destroy_collective_group("doomed")
    return _join(rank, 2, "survivors")


def test_a_killed_member_fails_the_pending_operations_with_peer_error(members: list[Any]) -> None:
    assert on(members, _join, 3, "doomed") == [3.0] * 3
    survivors, victim = members[:2], members[2]
    pending = [m.run.remote(_wait_for_death, r, "doomed") for r, m in enumerate(survivors)]
    time.sleep(1.0)  # both wait in the allreduce for the third member
    killed_at = time.time()
    ray.kill(victim)
    for name, is_peer_error, is_runtime_error, failed_at in ray.get(pending, timeout=60):
        assert (name, is_peer_error, is_runtime_error) == ("PeerError", True, True)
        print(f"DEATH-TIME {failed_at - killed_at:.2f} s")
        assert failed_at - killed_at < DEATH_BOUND, failed_at - killed_at
    # The survivors go on in a new group.
    assert on(survivors, _regroup) == [2.0, 2.0]


def _init_only(rank: int, name: str) -> bool:
    col.init_collective_group(2, rank, "gloo", name)
    return col.is_group_initialized(name)


def _ops_toward_the_dead(rank: int, name: str) -> list[tuple[str, bool, float]]:
    """allreduce, then recv from rank 1, each with a 60 s timeout: how each ends."""
    out = []
    for op in (
        lambda: col.allreduce(torch.ones(2), name, timeout=60),
        lambda: col.recv(torch.zeros(2), 1, name, timeout=60),
    ):
        start = time.monotonic()
        try:
            op()
        except Exception as exc:
            out.append((type(exc).__name__, isinstance(exc, PeerError), time.monotonic() - start))
        else:
            out.append(("no error", False, time.monotonic() - start))
    return out


def test_a_member_killed_before_any_link_existed_fails_the_others(members: list[Any]) -> None:
    # Ray's word on the member (its actor recorded at init) reaches the collective layer,
    # which never connected to it: PeerError within seconds, not the 60 s timeout.
    two = members[:2]
    assert on(two, _init_only, "unjoined") == [True, True]
    ray.kill(two[1])
    results = ray.get(two[0].run.remote(_ops_toward_the_dead, 0, "unjoined"), timeout=120)
    for what, is_peer_error, elapsed in results:
        print(f"DEATH-BEFORE-LINK {what} {elapsed:.2f} s")
        assert is_peer_error, (what, elapsed)
        assert elapsed < DEATH_BOUND, (what, elapsed)


def _late(rank: int) -> tuple[str, bool, float]:
    col.barrier("late", timeout=60)
    if rank == 1:
        return "idle", False, 0.0
    start = time.monotonic()
    try:
        col.allreduce(torch.ones(4), "late", timeout=1.0)  # rank 1 never joins this one
    except CollectiveTimeoutError as exc:
        return type(exc).__name__, isinstance(exc, RuntimeError), time.monotonic() - start
    return "no error", False, time.monotonic() - start


def test_every_operation_takes_a_timeout(pair: list[Any]) -> None:
    two = pair
    on(two, lambda r: col.init_collective_group(2, r, "gloo", "late"))
    outs = on(two, _late)
    name, is_runtime_error, took = outs[0]
    assert (name, is_runtime_error) == ("CollectiveTimeoutError", True)
    assert 1.0 <= took < 1.0 + 5.0


def _shm(rank: int) -> tuple[str, list[float]]:
    col.init_collective_group(2, rank, "gloo", "shm")
    big = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    if rank == 0:
        col.send(big, 1, "shm")
        link = col.get_group_handle("shm").pair_group(1).stats()["send"]
    else:
        got = torch.zeros_like(big)
        col.recv(got, 0, "shm")
        assert torch.equal(got, big)
        link = col.get_group_handle("shm").pair_group(0).stats()["recv"]
    col.barrier("shm")
    return link["transport"], [float(big[-1])]


def test_send_recv_on_one_node_use_shared_memory(pair: list[Any]) -> None:
    for transport, last in on(pair, _shm):
        assert transport == "shm"
        assert last == [float((1 << 18) - 1)]


_OTHER_JOB = textwrap.dedent(
    """
    import sys, ray, torch
    ray.init(address=sys.argv[1], namespace="p2p-raycoll-other", _node_ip_address="127.0.0.1",
             logging_level="WARNING")
    import p2p_worker.compat as col

    @ray.remote(num_cpus=0)
    class M:
        def go(self, rank):
            col.init_collective_group(2, rank, "gloo", "iso")
            t = torch.tensor([100.0])
            col.allreduce(t, "iso", timeout=60)
            col.barrier("iso", timeout=60)
            return t.item()

    team = [M.remote() for _ in range(2)]
    print("OTHER", ray.get([m.go.remote(r) for r, m in enumerate(team)], timeout=120))
    """
)


def _iso(rank: int) -> float:
    col.init_collective_group(2, rank, "gloo", "iso")
    t = torch.tensor([1.0])
    col.allreduce(t, "iso", timeout=60)
    col.barrier("iso", timeout=60)
    return t.item()


def test_the_same_group_name_in_another_job_and_namespace_never_meets(pair: list[Any]) -> None:
    address = ray.get_runtime_context().gcs_address
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_JOB, address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert on(pair, _iso) == [2.0, 2.0]
        out, _ = other.communicate(timeout=150)
    finally:
        other.kill()
    assert "OTHER [200.0, 200.0]" in out, out[-2000:]
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert len([n for n in names if n.startswith("rendezvous:")]) == 2, names


def _any_order(rank: int) -> list[float]:
    order = ["a", "b"] if rank == 0 else ["b", "a"]
    for name in order:  # initialized in opposite orders, with opposite ranks in "b"
        col.init_collective_group(2, rank if name == "a" else 1 - rank, "gloo", name)
    first = torch.tensor([float(rank + 1)])
    col.allreduce(first, "a", timeout=60)
    second = torch.tensor([10.0 * (rank + 1)])
    col.allreduce(second, "b", timeout=60)
    handle = col.get_group_handle("b")
    work = handle.group.allreduce(torch.tensor([float(handle.rank)]), async_op=True)
    return [first.item(), second.item(), float(work.wait(timeout=60).item())]


def test_groups_in_any_order_and_asynchronous_calls_on_the_handle(pair: list[Any]) -> None:
    outs = on(pair, _any_order)
    assert outs[0] == [3.0, 30.0, 1.0]
    assert outs[1] == [3.0, 30.0, 1.0]


def _actor_side(rank: int) -> float:
    col.init_collective_group(2, 1, "gloo", "with-driver")
    t = torch.tensor([5.0])
    col.allreduce(t, "with-driver", timeout=60)
    col.barrier("with-driver", timeout=60)
    col.destroy_collective_group("with-driver")
    return t.item()


def test_the_driver_can_be_a_member(pair: list[Any]) -> None:
    ref = pair[0].run.remote(_actor_side, 1)
    col.init_collective_group(2, 0, "gloo", "with-driver")
    try:
        t = torch.tensor([1.0])
        col.allreduce(t, "with-driver", timeout=60)
        col.barrier("with-driver", timeout=60)
    finally:
        col.destroy_collective_group("with-driver")
    assert t.item() == 6.0
    assert ray.get(ref, timeout=CALL_TIMEOUT) == 6.0
