"""Network namespaces of the multinode harness: names, probes, processes, state, teardown.

The lower half of ``netns_cluster.py``: everything that deals with namespaces one at a
time (or with every namespace the harness made), never with a whole running cluster.
Names: ``p2pmn-<tag>-h`` (head), ``-w``, ``-w2``... (worker nodes), ``-s`` (the switch);
each node's interface is ``p2pmn0``. A cluster's state file and Ray temp dirs live under
``/tmp/p2pmn/<tag>/``. Teardown signals exactly the processes inside the namespaces
(never ``ray stop``, which would reach other people's clusters) and deletes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "p2pmn"
IFNAME = "p2pmn0"
BRIDGE = "p2pmnbr"
STATE_ROOT = Path("/tmp/p2pmn")
MAX_NODES = 9
"""Nodes' addresses end in 1..9, so their order as strings is their order as numbers."""
TAG_RE = re.compile(r"^[a-z0-9]{1,16}$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


class NetnsUnavailableError(RuntimeError):
    """Network namespaces cannot be made here (not Linux, not root, no ``ip``, EPERM)."""


class NetnsClusterError(RuntimeError):
    """A step of bringing the cluster up, shaping it or running a driver failed."""


def run_cmd(cmd: str | list[str], *, timeout: float = 30.0, check: bool = True) -> str:
    """Run a command (a string is split on spaces) and return its stdout.

    Raises:
        NetnsClusterError: It failed (with ``check``) or could not start; stderr included.
    """
    argv = cmd.split() if isinstance(cmd, str) else cmd
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsClusterError(f"{' '.join(argv)}: {exc}") from exc
    if check and proc.returncode != 0:
        raise NetnsClusterError(
            f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
        )
    return proc.stdout


def parse_rate(rate: str | int) -> int:
    """Parse a tc-style rate (``"1gbit"``, ``"200mbit"``) or bits/s as int into bits/s.

    Args:
        rate: The rate, as tc writes it or as an integer number of bits per second.

    Returns:
        The rate in bits per second.

    Raises:
        ValueError: ``rate`` is not positive or not of the form ``<number><unit>``.
    """
    if isinstance(rate, int):
        if rate <= 0:
            raise ValueError(f"rate must be positive bits/s, got {rate!r}")
        return rate
    match = _RATE_RE.match(rate.strip().lower())
    if not match:
        raise ValueError(f"rate must look like '1gbit', '200mbit' or '500kbit', got {rate!r}")
    return int(float(match.group(1)) * _RATE_UNITS[match.group(2)])


def ray_bin() -> Path:
    """The ``ray`` CLI of the running interpreter's environment (next to ``sys.executable``)."""
    return Path(sys.executable).parent / "ray"


def check_support() -> str | None:
    """Say why namespaces cannot be made here, or None when they can.

    Creates and deletes a throwaway namespace pair with a veth link to prove it.
    """
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root, running as euid {os.geteuid()}"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not on PATH"
    if not ray_bin().exists():
        return f"no `ray` CLI next to {sys.executable}"
    probe = [f"{PREFIX}-probe{os.getpid()}-{i}" for i in (1, 2)]
    try:
        for ns in probe:
            run_cmd(f"ip netns add {ns}")
        run_cmd(veth_cmd(*probe))
        run_cmd(f"ip -n {probe[0]} link add {BRIDGE} type bridge")
        run_cmd(f"ip -n {probe[0]} link set {IFNAME} master {BRIDGE}")
    except NetnsClusterError as exc:
        return f"cannot create a namespace pair with a veth link and a bridge: {exc}"
    finally:
        for ns in probe:
            run_cmd(f"ip netns del {ns}", check=False)
    return None


def veth_cmd(ns_a: str, ns_b: str, name_b: str = IFNAME) -> str:
    # Both ends are created straight inside the namespaces: nothing appears on the host.
    return f"ip link add {IFNAME} netns {ns_a} type veth peer name {name_b} netns {ns_b}"


def node_roles(num_nodes: int) -> list[tuple[str, str]]:
    """(role, namespace suffix) of each node: head ``h``, worker ``w``, worker2 ``w2``, ..."""
    roles = [("head", "h"), ("worker", "w")]
    return roles + [(f"worker{i}", f"w{i}") for i in range(2, num_nodes)]


def cluster_namespaces(tag: str) -> list[str]:
    """The namespaces of cluster ``tag`` that exist: worker nodes, head, switch."""
    mine = [ns for ns in list_namespaces() if ns.startswith(f"{PREFIX}-{tag}-")]
    return sorted(mine, key=lambda ns: ({"h": 1, "s": 2}.get(ns.rsplit("-", 1)[1], 0), ns))


def list_namespaces() -> list[str]:
    """Names of every network namespace this harness made (``p2pmn-...``)."""
    out = run_cmd("ip netns list", check=False)
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX + "-")]


def namespace_pids(ns: str) -> list[int]:
    """Live (non-zombie) processes inside namespace ``ns``."""
    out = run_cmd(f"ip netns pids {ns}", check=False)
    pids = []
    for tok in out.split():
        pid = int(tok)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            pids.append(pid)
    return pids


def kill_namespace_processes(ns: str, *, grace: float = 5.0) -> list[int]:
    """SIGTERM every process in ``ns``, SIGKILL what is left after ``grace`` seconds.

    Returns:
        The pids that were signalled.
    """
    pids = namespace_pids(ns)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in namespace_pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while namespace_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not namespace_pids(ns):
            break
    left = namespace_pids(ns)
    if left:
        raise NetnsClusterError(f"processes {left} in namespace {ns} survived SIGKILL")
    return pids


def proc_start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_alive(state: dict[str, object]) -> bool:
    pid = state.get("owner_pid")
    if not isinstance(pid, int) or pid <= 0:
        return True  # made by the CLI: lives until `down` names it
    return proc_start_time(pid) == state.get("owner_start")


def read_state(tag: str) -> dict[str, object]:
    """The state file of cluster ``tag`` (empty dict when there is none)."""
    try:
        data = json.loads((STATE_ROOT / tag / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def known_tags() -> list[str]:
    """Tags of every cluster with a namespace or a state dir on this machine."""
    tags = {ns[len(PREFIX) + 1 :].rsplit("-", 1)[0] for ns in list_namespaces()}
    if STATE_ROOT.is_dir():
        tags.update(p.name for p in STATE_ROOT.iterdir() if p.is_dir())
    return sorted(t for t in tags if TAG_RE.match(t) and not t.startswith("probe"))


def teardown(tag: str, *, keep_logs: bool = False) -> None:
    """Remove cluster ``tag``: its processes, namespaces (and so the veths) and temp dirs."""
    errors = []
    for ns in cluster_namespaces(tag):
        try:
            kill_namespace_processes(ns)
        except NetnsClusterError as exc:
            errors.append(str(exc))
        run_cmd(f"ip netns del {ns}", check=False)
    if not keep_logs:
        shutil.rmtree(STATE_ROOT / tag, ignore_errors=True)
    if errors:
        raise NetnsClusterError("; ".join(errors))


def cleanup_stale() -> list[str]:
    """Tear down every cluster whose owning process is gone; return their tags.

    Also deletes namespaces left by a ``check_support`` probe whose process died.
    """
    for ns in list_namespaces():
        match = re.match(rf"^{PREFIX}-probe(\d+)-\d$", ns)
        if match and proc_start_time(int(match.group(1))) is None:
            run_cmd(f"ip netns del {ns}", check=False)
    stale = [t for t in known_tags() if not owner_alive(read_state(t))]
    for tag in stale:
        teardown(tag)
    return stale
