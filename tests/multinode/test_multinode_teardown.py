"""The harness leaves nothing behind: processes, namespaces, veth ends, temp dirs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "netns_cluster.py"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _assert_gone(harness: ModuleType, cluster: Any, pids: list[int]) -> None:
    names = harness.list_namespaces()
    assert not {n.netns for n in cluster.hosts} & set(names)
    assert cluster.switch_netns not in names
    assert not harness.cluster_namespaces(cluster.tag)
    assert not [p for p in pids if _alive(p)]
    assert not (harness.STATE_ROOT / cluster.tag).exists()
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert harness.IFNAME not in host_links
    assert harness.BRIDGE not in host_links


@pytest.mark.parametrize("num_nodes", [2, 3])  # a veth pair; a switch with three cables
def test_down_removes_processes_namespaces_link_and_temp_dirs(
    netns_harness: ModuleType, cluster_factory: Any, num_nodes: int
) -> None:
    cluster = cluster_factory(num_nodes=num_nodes)
    cluster.up(timeout=180)
    cluster.shape("100mbit")
    pids = [p for node in cluster.hosts for p in netns_harness.namespace_pids(node.netns)]
    assert len(pids) >= 2 * num_nodes  # gcs, raylets, ... on every node
    assert len(netns_harness.cluster_namespaces(cluster.tag)) == num_nodes + (num_nodes > 2)
    assert (netns_harness.STATE_ROOT / cluster.tag / "h").is_dir()
    cluster.down()
    _assert_gone(netns_harness, cluster, pids)
    cluster.down()  # idempotent


def test_cli_down_cleans_up_after_an_owner_that_was_killed(
    netns_harness: ModuleType, cluster_factory: Any
) -> None:
    cluster = cluster_factory()  # only for its tag and names; another process brings it up
    code = (
        "import importlib.util, os, signal, sys\n"
        f"spec = importlib.util.spec_from_file_location('netns_cluster', {str(TOOL)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['netns_cluster'] = m\n"
        "spec.loader.exec_module(m)\n"
        f"m.NetnsCluster(tag={cluster.tag!r}).up(timeout=180)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no finalizer\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stderr[-3000:]
    pids = [*netns_harness.namespace_pids(cluster.head.netns)]
    pids += netns_harness.namespace_pids(cluster.worker.netns)
    assert pids, "the killed owner's cluster should still be running"
    status = subprocess.run(
        [sys.executable, str(TOOL), "status"], capture_output=True, text=True, timeout=60
    )
    assert f"cluster {cluster.tag}:" in status.stdout
    assert "stale" in status.stdout
    down = subprocess.run(
        [sys.executable, str(TOOL), "down", "--tag", "nosuchtag"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr
    assert f"cluster {cluster.tag}: down" in down.stdout
    _assert_gone(netns_harness, cluster, pids)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_check_support_names_the_reason_when_not_root(netns_harness: ModuleType) -> None:
    # User nobody may not be able to read the clone (a 0700 home or mktemp -d folder): it
    # runs a world-readable copy of the harness, with the interpreter the venv links to.
    where = Path(tempfile.mkdtemp(prefix="p2p-nobody-"))
    where.chmod(0o755)
    copy = where / TOOL.name
    for part in TOOL.parent.glob("netns_*.py"):  # the harness and the modules it imports
        shutil.copyfile(part, where / part.name)
        (where / part.name).chmod(0o644)
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('netns_cluster', {str(copy)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['netns_cluster'] = m\n"
        "spec.loader.exec_module(m); print(m.check_support())\n"
    )
    python = os.path.realpath(sys.executable)
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c"]
    try:
        proc = subprocess.run([*argv, code], capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert "needs root" in proc.stdout
    assert os.geteuid() == 0  # we, the test process, are root (netns_harness did not skip)
