"""RLinf's managers, Cluster.NAMESPACE, worker node ranks and user extensions on real Ray."""

from __future__ import annotations

import os
import pickle
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from p2p_worker import (
    Cluster,
    CollectiveGroupInfo,
    CollectiveManager,
    Manager,
    NodePlacementStrategy,
    Worker,
    WorkerAddress,
    WorkerError,
    WorkerInfo,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _info(group: str, rank: int) -> WorkerInfo:
    return WorkerInfo(WorkerAddress(group, rank), rank, 0, None, "127.0.0.1")


class Tally(Manager):
    """A user-defined manager: one counter shared by every process of the job."""

    MANAGER_NAME = "p2p-test-tally"

    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int) -> int:
        self.total += n
        return self.total

    def namespace(self) -> str | None:
        return Cluster.NAMESPACE


class Probe(Worker):
    def where(self) -> dict[str, Any]:
        return {
            "namespace": Cluster.NAMESPACE,
            "env": os.environ.get("CLUSTER_NAMESPACE"),
            "node": self._cluster_node_rank,
            "node_local": self._node_local_rank,
            "accel": self._local_accelerator_rank,
        }

    def add(self, n: int) -> int:
        return int(Tally.get_proxy().add(n))

    def group_port(self, name: str) -> int | None:
        port = CollectiveManager.get_proxy().get_master_port_info(name)
        return None if port is None else int(port)


class SeesExtension(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.seen_at_init = os.environ.get("P2P_TEST_EXT_REGISTERED")

    def seen(self) -> str | None:
        return self.seen_at_init


@pytest.fixture
def restore_namespace() -> Iterator[None]:
    saved, env = Cluster.NAMESPACE, os.environ.get("CLUSTER_NAMESPACE")
    yield
    Cluster.NAMESPACE = saved
    if env is None:
        os.environ.pop("CLUSTER_NAMESPACE", None)
    else:
        os.environ["CLUSTER_NAMESPACE"] = env


# -- local behaviour -------------------------------------------------------------------------


def test_runtime_env_vars_carry_namespace(
    restore_namespace: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    Cluster.NAMESPACE = "ns-a"
    env = Manager.get_runtime_env_vars()
    assert env == {"RAY_ADDRESS": "127.0.0.1:6379", "CLUSTER_NAMESPACE": "ns-a"}
    env["CLUSTER_NAMESPACE"] = "changed"  # a fresh dict each time
    assert Manager.get_runtime_env_vars()["CLUSTER_NAMESPACE"] == "ns-a"


def test_constructing_a_manager_syncs_namespace(
    restore_namespace: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    Cluster.NAMESPACE = "before"
    monkeypatch.setenv("CLUSTER_NAMESPACE", "")
    CollectiveManager()
    assert Cluster.NAMESPACE == "before"  # an empty variable changes nothing
    monkeypatch.setenv("CLUSTER_NAMESPACE", "from-env")
    manager = CollectiveManager()
    assert Cluster.NAMESPACE == "from-env"
    assert manager.get_collective_group("none") is None


def test_collective_manager_registry() -> None:
    manager = CollectiveManager()
    a, b = _info("g", 0), _info("g", 1)
    info = CollectiveGroupInfo("g", [a, b], "127.0.0.1")
    manager.register_collective_group(info)
    manager.register_collective_group(CollectiveGroupInfo("g", [a, b], "127.0.0.1"))  # equal
    assert manager.get_collective_group("g") is info
    assert manager.get_master_port_info("g") is None
    manager.set_master_port_info("g", 29501)
    assert manager.get_master_port_info("g") == 29501
    manager.reset_master_port_info("g")
    assert manager.get_master_port_info("g") is None
    with pytest.raises(ValueError, match="is registered as"):
        manager.register_collective_group(CollectiveGroupInfo("g", [b, a], "127.0.0.1"))
    with pytest.raises(ValueError, match="no collective group 'h'"):
        manager.set_master_port_info("h", 1)
    with pytest.raises(ValueError, match="master_port"):
        manager.set_master_port_info("g", 70000)
    with pytest.raises(TypeError, match="group_info"):
        manager.register_collective_group("g")  # type: ignore[arg-type]
    assert manager.get_collective_group("g") is info  # still usable after refusals


def test_group_info_refuses_duplicates_and_pickles() -> None:
    a = _info("g", 0)
    with pytest.raises(ValueError, match="appears twice"):
        CollectiveGroupInfo("g", [a, a], "127.0.0.1")
    with pytest.raises(ValueError, match="group_name"):
        CollectiveGroupInfo("", [a], "127.0.0.1")
    info = CollectiveGroupInfo("g", [a], "10.0.0.1")
    info.master_port = 5
    copy = pickle.loads(pickle.dumps(info))
    assert copy == info
    assert copy.master_port == 5
    assert copy.world_size == 1
    assert info != CollectiveGroupInfo("g", [a], "10.0.0.2")


def test_get_proxy_needs_a_name() -> None:
    with pytest.raises(ValueError, match="MANAGER_NAME is empty"):
        Manager.get_proxy()


def test_load_user_extensions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "p2p_ext_ok.py").write_text(
        "calls = []\ndef register():\n    calls.append('registered')\n"
    )
    (tmp_path / "p2p_ext_bad.py").write_text("def register():\n    raise KeyError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("P2P_EXT_MODULE", raising=False)
    worker = Worker()
    monkeypatch.setenv("RLINF_EXT_MODULE", "p2p_ext_ok")
    worker._load_user_extensions()
    import p2p_ext_ok  # type: ignore[import-not-found]

    assert p2p_ext_ok.calls == ["registered"]
    monkeypatch.setenv("P2P_EXT_MODULE", "p2p_ext_bad")
    with pytest.raises(WorkerError, match=r"p2p_ext_bad.*register\(\) failed") as exc:
        worker._load_user_extensions()
    assert isinstance(exc.value.__cause__, KeyError)
    monkeypatch.setenv("P2P_EXT_MODULE", "p2p_no_such_module")
    with pytest.raises(WorkerError, match=r"P2P_EXT_MODULE.*cannot be imported"):
        worker._load_user_extensions()


# -- on Ray ----------------------------------------------------------------------------------


def test_namespace_reaches_workers_and_node_ranks(cluster: Cluster) -> None:
    assert cluster._num_nodes == cluster.num_nodes == 1
    driver_ns = ray.get_runtime_context().namespace
    assert driver_ns == Cluster.NAMESPACE
    group = Probe.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="ns-probe")
    where = group.where().wait(timeout=120)
    assert [w["namespace"] for w in where] == [driver_ns, driver_ns]
    assert [w["env"] for w in where] == [driver_ns, driver_ns]
    assert [w["node"] for w in where] == [0, 0]
    assert sorted(w["node_local"] for w in where) == [0, 1]
    assert [w["accel"] for w in where] == [-1, -1]
    group._close()  # RLinf's private name for shutdown()
    assert not [n for n in ray.util.list_named_actors() if n.startswith("ns-probe")]


def test_manager_proxy_shared_by_driver_and_workers(cluster: Cluster) -> None:
    group = Probe.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="tally")
    proxy = Tally.get_proxy()  # the driver creates the actor
    assert proxy.add(1) == 1
    assert sorted(group.add(10).wait(timeout=120)) == [11, 21]
    assert proxy.add(0) == 21
    assert proxy.namespace() == Cluster.NAMESPACE  # the actor got the namespace too
    assert Tally.get_proxy() is proxy  # one proxy per class and process
    with pytest.raises(AttributeError, match="no public method '_private'"):
        proxy._private
    with pytest.raises(AttributeError, match="no public method 'missing'"):
        proxy.missing

    coll = CollectiveManager.get_proxy()
    coll.register_collective_group(CollectiveGroupInfo("pair", [_info("g", 0)], "127.0.0.1"))
    coll.set_master_port_info("pair", 29555)
    assert group.group_port("pair").wait(timeout=120) == [29555, 29555]
    with pytest.raises(ValueError, match="is registered as"):  # the actor's error, re-raised
        coll.register_collective_group(CollectiveGroupInfo("pair", [_info("g", 1)], "127.0.0.1"))
    ray.kill(proxy.actor)
    ray.kill(coll.actor)


def test_get_proxy_no_wait_when_absent(cluster: Cluster) -> None:
    class Absent(Manager):
        MANAGER_NAME = "p2p-test-absent"

    with pytest.raises(ValueError, match="no manager actor named 'p2p-test-absent'"):
        Absent.get_proxy(no_wait=True)
    with pytest.raises(ValueError, match="timeout"):
        Absent.get_proxy(timeout=0)


def test_extension_loaded_before_worker_init(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "p2p_ext_env.py").write_text(
        textwrap.dedent(
            """
            import os

            def register():
                os.environ["P2P_TEST_EXT_REGISTERED"] = "yes"
            """
        )
    )
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"RLINF_EXT_MODULE": "p2p_ext_env", "PYTHONPATH": path}
    group = SeesExtension.create_group().launch(
        cluster, NodePlacementStrategy([0]), name="ext", runtime_env={"env_vars": env}
    )
    assert group.seen().wait(timeout=120) == ["yes"]
    with pytest.raises(WorkerError, match=r"p2p_no_such_ext.*cannot be imported"):
        SeesExtension.create_group().launch(
            cluster,
            NodePlacementStrategy([0]),
            name="ext-bad",
            runtime_env={"env_vars": {**env, "RLINF_EXT_MODULE": "p2p_no_such_ext"}},
        )
