"""Cluster, launch and shutdown on a real embedded Ray cluster."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import ray

from p2p_asyncwork import ConfigError
from p2p_worker import (
    Cluster,
    ClusterError,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    Worker,
    WorkerError,
    WorkerGroup,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


class Pid(Worker):
    def pid(self) -> int:
        return os.getpid()

    def die(self) -> None:
        os._exit(3)

    def hello(self) -> int:
        return self._rank


class BadInit(Worker):
    def __init__(self, fail_rank: int) -> None:
        super().__init__()
        if self._rank == fail_rank:
            raise RuntimeError(f"cannot start rank {fail_rank}")


class SlowInit(Worker):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        time.sleep(seconds)


def named_actors() -> set[str]:
    return set(ray.util.list_named_actors())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listen_addresses(port: int) -> set[str]:
    """Local addresses LISTENing on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for name in ("tcp", "tcp6"):
        path = Path(f"/proc/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":
                found.add(addr)
    return found


def test_cluster_reports_nodes_and_binds_loopback(cluster: Cluster) -> None:
    assert cluster.num_nodes == 1
    assert cluster.is_embedded
    node = cluster.nodes[0]
    assert node.ip == "127.0.0.1"
    assert node.is_driver_node
    assert node.node_rank == 0
    assert cluster.num_cpus == node.num_cpus >= 1
    assert cluster.num_gpus == 0
    host, port = cluster.store_address
    assert host == "127.0.0.1"
    if Path("/proc/net/tcp").exists():
        assert listen_addresses(port) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0
    assert "1 node(s)" in cluster.summary()
    assert "127.0.0.1" in repr(cluster)
    with socket.create_connection((host, port), timeout=5):
        pass


def test_config_errors_surface_at_cluster_creation(ray_session: object) -> None:
    with pytest.raises(ConfigError) as info:
        Cluster(config={"cluster": {"num_nodes": 1, "bogus": True}})
    assert info.value.path == "cluster.bogus"
    with pytest.raises(ConfigError) as info:
        Cluster(config="cluster:\n  num_nodes: 0\n")
    assert info.value.path == "cluster.num_nodes"
    with pytest.raises(ConfigError) as info:
        Cluster(config={"collective": {"tensor_compression": {"codec": "snappy"}}})
    assert info.value.path.startswith("cluster.collective.tensor_compression")
    with pytest.raises(ValueError, match="disagrees"):
        Cluster(num_nodes=2, config={"num_nodes": 1})
    with pytest.raises(ClusterError, match="exactly one node"):
        Cluster(num_nodes=2)


def test_short_resources_fail_fast(cluster: Cluster) -> None:
    start = time.monotonic()
    with pytest.raises(PlacementError, match="GPUs"):
        Pid.create_group().launch(cluster, PackedPlacementStrategy(1, gpus_per_worker=1))
    with pytest.raises(PlacementError, match=f"only {int(cluster.num_cpus)} fit"):
        Pid.create_group().launch(
            cluster, PackedPlacementStrategy(int(cluster.num_cpus) + 1, cpus_per_worker=1)
        )
    with pytest.raises(PlacementError, match=r"node rank\(s\) \[1\]"):
        Pid.create_group().launch(cluster, NodePlacementStrategy([1], cpus_per_worker=0))
    assert time.monotonic() - start < 10
    assert cluster.groups == []


def test_failed_start_reports_the_rank_and_cleans_up(cluster: Cluster) -> None:
    with pytest.raises(WorkerError) as info:
        BadInit.create_group(1).launch(
            cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="bad_init"
        )
    err = info.value
    assert (err.group_name, err.rank, err.method) == ("bad_init", 1, "__init__")
    assert "cannot start rank 1" in str(err)
    assert isinstance(err.__cause__, RuntimeError)
    assert not {n for n in named_actors() if n.startswith("bad_init:")}
    assert cluster.groups == []
    ok = BadInit.create_group(5).launch(
        cluster, NodePlacementStrategy([0], cpus_per_worker=0), name="bad_init"
    )
    assert ok.world_size == 1


def test_launch_timeout_is_an_error_not_a_hang(cluster: Cluster) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError, match="did not start within") as info:
        SlowInit.create_group(60.0).launch(
            cluster, NodePlacementStrategy([0], cpus_per_worker=0), name="slow", timeout=5.0
        )
    assert info.value.group_name == "slow"
    assert time.monotonic() - start < 30
    assert not {n for n in named_actors() if n.startswith("slow:")}
    assert cluster.groups == []


def test_names_are_checked(cluster: Cluster) -> None:
    one = NodePlacementStrategy([0], cpus_per_worker=0)
    g = Pid.create_group().launch(cluster, one, name="dup")
    with pytest.raises(ValueError, match="already running"):
        Pid.create_group().launch(cluster, one, name="dup")
    with pytest.raises(ValueError, match="already launched"):
        g.launch(cluster, one, name="other")
    with pytest.raises(ValueError, match="not a valid group name"):
        Pid.create_group().launch(cluster, one, name="a:b")
    with pytest.raises(TypeError, match="Cluster"):
        Pid.create_group().launch("cluster")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="subclass of Worker"):
        WorkerGroup(int, (), {})  # type: ignore[type-var]


def test_dead_worker_reaches_caller_others_survive(cluster: Cluster) -> None:
    group = Pid.create_group().launch(
        cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="mortal"
    )
    with pytest.raises(WorkerError, match="died") as info:
        group.execute_on(1).die().wait(timeout=60)
    assert (info.value.group_name, info.value.rank) == ("mortal", 1)
    assert group.execute_on(0).hello().wait(timeout=60) == [0]


def test_shutdown_leaves_no_actors_or_processes(ray_session: object) -> None:
    cluster = Cluster(num_nodes=1)
    a = Pid.create_group().launch(
        cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="gone_a"
    )
    b = Pid.create_group().launch(cluster, NodePlacementStrategy([0], cpus_per_worker=0))
    assert b.name == "Worker_group_Pid"  # the default name
    pids = a.pid().wait(timeout=60) + b.pid().wait(timeout=60)
    assert {"gone_a:0", "gone_a:1", "Worker_group_Pid:0"} <= named_actors()
    assert all(alive(p) for p in pids)
    cluster.shutdown()
    assert not {n for n in named_actors() if n.startswith(("gone_a:", "Worker_group_Pid:"))}
    assert not [p for p in pids if alive(p)]
    assert cluster.groups == []
    assert not a.launched
    with pytest.raises(WorkerError, match="shut down"):
        a.pid()
    cluster.shutdown()  # idempotent
    with pytest.raises(ClusterError, match="shut down"):
        Pid.create_group().launch(cluster, NodePlacementStrategy([0], cpus_per_worker=0))
    assert ray.is_initialized()  # the session's connection stays up


def test_cluster_without_arguments_is_the_one_open_cluster(ray_session: object) -> None:
    from p2p_worker._job._cluster import live_clusters

    assert live_clusters() == [ray_session]  # the session's base Cluster, nothing else open
    again = Cluster()  # RLinf's Cluster(): the job's one Cluster
    assert again is ray_session
    assert not again._closed
    own = Cluster(num_nodes=1)  # arguments: a job of its own, as before
    try:
        assert own is not ray_session
        fresh = Cluster()  # two open: no guess, a new one
        try:
            assert fresh is not own
            assert fresh is not ray_session
            assert len(live_clusters()) == 3
        finally:
            fresh.shutdown()
    finally:
        own.shutdown()
    assert Cluster() is ray_session
