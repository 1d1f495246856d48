"""A Ray cluster of N nodes on one Linux machine: one network namespace per node.

The head namespace ``p2pmn-<tag>-h`` holds ``10.231.0.1``, the first worker namespace
``p2pmn-<tag>-w`` holds ``10.231.0.2``, and with more than two nodes ``p2pmn-<tag>-w2``,
``-w3``, ... hold ``.3``, ``.4``, ...; each on an interface named ``p2pmn0``. Two nodes
are joined by one veth pair; three or more each have a veth pair whose other end is a
port of a bridge in a switch namespace ``p2pmn-<tag>-s`` (a switch with one cable per
node). No end lives on the host: the host never sees these addresses, and the namespaces
have no route anywhere else. Each namespace has its own loopback.
``ray start`` runs inside each namespace with its own short ``--temp-dir`` under
``/tmp/p2pmn/<tag>/``, so the cluster never meets other Ray clusters on the machine.
Drivers run inside the head namespace as subprocesses (``ip netns exec``) with
``RAY_ADDRESS`` set; they report back by printing ``P2PMN-RESULT <json>``.

``tc qdisc ... tbf`` shapes each node's cable in both directions, as a NIC of that rate
would: on the node's ``p2pmn0`` (what it sends) and, with a switch, on the switch's port
towards it (what it receives; with two nodes that is the peer's ``p2pmn0``).

Teardown never uses ``ray stop``: that command kills every Ray process on the machine,
other people's clusters included. Instead it signals exactly the processes that live in
the cluster's namespaces (``ip netns pids``), then deletes the namespaces (which destroys
the veth pairs and the bridge) and the temp dirs.

Library use::

    cluster = NetnsCluster(tag="demo")  # num_nodes=4: a head and three worker nodes
    cluster.up()
    try:
        cluster.shape("1gbit")
        res = cluster.run_driver(["drivers/probe.py"], timeout=60)
    finally:
        cluster.down()

CLI: ``python tools/netns_cluster.py up|down|status|exec`` (see ``--help``).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_driver import EVENT_PREFIX, RESULT_PREFIX, Driver, DriverResult
from netns_namespaces import (
    BRIDGE,
    IFNAME,
    MAX_NODES,
    PREFIX,
    STATE_ROOT,
    TAG_RE,
    NetnsClusterError,
    NetnsUnavailableError,
    check_support,
    cleanup_stale,
    cluster_namespaces,
    kill_namespace_processes,
    known_tags,
    list_namespaces,
    namespace_pids,
    node_roles,
    owner_alive,
    parse_rate,
    proc_start_time,
    ray_bin,
    read_state,
    run_cmd,
    teardown,
    veth_cmd,
)

__all__ = [
    "BRIDGE",
    "EVENT_PREFIX",
    "IFNAME",
    "MAX_NODES",
    "PREFIX",
    "RESULT_PREFIX",
    "SLOW_REGISTRATION",
    "STATE_ROOT",
    "Driver",
    "DriverResult",
    "NetnsCluster",
    "NetnsClusterError",
    "NetnsUnavailableError",
    "Node",
    "check_support",
    "cleanup_stale",
    "cluster_namespaces",
    "kill_namespace_processes",
    "known_tags",
    "list_namespaces",
    "main",
    "namespace_pids",
    "node_roles",
    "parse_rate",
    "ray_bin",
    "read_state",
    "teardown",
]


# What `ray start` prints when a node it started has not registered within its fixed 30 s
# (ray/_private/node.py); the node's processes keep running (`ray start` does not block).
SLOW_REGISTRATION = "The current node timed out during startup"


@dataclass(frozen=True)
class Node:
    """One test host: its role, namespace, address on the veth link, and Ray temp dir."""

    role: str
    netns: str
    ip: str
    temp_dir: Path


@dataclass
class NetnsCluster:
    """Ray nodes in network namespaces: two joined by a veth link, or more by a switch.

    Args:
        tag: Short unique name (``[a-z0-9]{1,16}``); default the current pid.
        num_nodes: Nodes, the head included (2 to ``MAX_NODES``).
        subnet: First three octets of the private /24 on the veth link.
        port: GCS port of the head, inside the head namespace.
        num_cpus: Logical CPUs each node advertises to Ray.
        object_store_bytes: Plasma store size of each node.
        persistent: Leave the cluster up when this process exits (the CLI's ``up``).
        gloo_ifname: When set, GLOO_SOCKET_IFNAME for every Ray process; by default it is
            removed from the environment so that the code under test must pick the node
            address itself.

    Raises:
        ValueError: A bad tag, subnet, node count or size.
    """

    tag: str = field(default_factory=lambda: str(os.getpid()))
    num_nodes: int = 2
    subnet: str = "10.231.0"
    port: int = 6379
    num_cpus: int = 4
    object_store_bytes: int = 256 * 1024**2
    persistent: bool = False
    gloo_ifname: str | None = None
    rate_bps: int | None = field(default=None, init=False)
    nodes: list[dict[str, object]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not TAG_RE.match(self.tag):
            raise ValueError(f"tag must match [a-z0-9]{{1,16}}, got {self.tag!r}")
        if not re.match(r"^10\.\d{1,3}\.\d{1,3}$", self.subnet):
            raise ValueError(f"subnet must be three octets of 10.0.0.0/8, got {self.subnet!r}")
        if self.num_cpus < 1 or self.object_store_bytes < 80 * 1024**2:
            raise ValueError("num_cpus must be >= 1 and object_store_bytes >= 80 MiB")
        if not 2 <= self.num_nodes <= MAX_NODES:
            raise ValueError(f"num_nodes must be 2 to {MAX_NODES}, got {self.num_nodes!r}")
        made = STATE_ROOT / self.tag
        self.hosts: tuple[Node, ...] = tuple(
            Node(role, f"{PREFIX}-{self.tag}-{sfx}", f"{self.subnet}.{i + 1}", made / sfx)
            for i, (role, sfx) in enumerate(node_roles(self.num_nodes))
        )
        self.head, self.worker = self.hosts[0], self.hosts[1]
        # With more than two nodes, each node's cable ends in a port of a bridge here.
        self.switch_netns = f"{PREFIX}-{self.tag}-s" if self.num_nodes > 2 else None

    @property
    def workers(self) -> tuple[Node, ...]:
        """Every node but the head, in address order."""
        return self.hosts[1:]

    @staticmethod
    def switch_port(node: Node) -> str:
        """Name of the switch's port towards ``node`` (in ``switch_netns``)."""
        return f"{PREFIX}-{node.netns.rsplit('-', 1)[-1]}"

    @property
    def token_path(self) -> Path:
        """This cluster's private Ray auth token file (made by ``up``)."""
        return STATE_ROOT / self.tag / "auth_token"

    @property
    def address(self) -> str:
        """``host:port`` of the head's GCS, reachable from inside either namespace."""
        return f"{self.head.ip}:{self.port}"

    def node(self, role: str) -> Node:
        """The node of role ``role``: ``head``, ``worker``, ``worker2``, ..."""
        for node in self.hosts:
            if node.role == role:
                return node
        roles = tuple(n.role for n in self.hosts)
        raise ValueError(f"role must be one of {roles}, got {role!r}")

    # ---- environment -------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for Ray processes and drivers of this cluster."""
        env = dict(os.environ)
        for key in (
            "RAY_ADDRESS",
            "GLOO_SOCKET_IFNAME",
            "RAY_TMPDIR",
            "P2P_RAY_TMPDIR",
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
        ):
            env.pop(key, None)
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            # 0 would make `ray start --address` refuse to join (it means "no multi-node").
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1",
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONUNBUFFERED="1",
            P2PMN_TAG=self.tag,
            P2PMN_HEAD_IP=self.head.ip,
            P2PMN_WORKER_IP=self.worker.ip,
            P2PMN_NODE_IPS=",".join(n.ip for n in self.hosts),
            P2PMN_NUM_NODES=str(self.num_nodes),
            P2PMN_IFNAME=IFNAME,
            # Ray >= 2.5x turns token auth on for a head that finds ~/.ray/auth_token (any
            # local ray.init() writes one), and a joining node then fails to authenticate.
            # The cluster has its own token, independent of that shared file.
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token_path),
        )
        if self.gloo_ifname:
            env["GLOO_SOCKET_IFNAME"] = self.gloo_ifname
        env.update(extra or {})
        return env

    # ---- lifecycle -----------------------------------------------------------------------
    def up(self, *, timeout: float = 120.0) -> None:
        """Create the namespaces and links, start every Ray node, wait until all are alive.

        Raises:
            NetnsUnavailableError: Namespaces cannot be made here.
            NetnsClusterError: A step failed; everything made so far is torn down.
        """
        reason = check_support()
        if reason:
            raise NetnsUnavailableError(reason)
        if any(ns.startswith(f"{PREFIX}-{self.tag}-") for ns in list_namespaces()):
            raise NetnsClusterError(f"a cluster tagged {self.tag!r} exists; `down` it first")
        STATE_ROOT.joinpath(self.tag).mkdir(parents=True, exist_ok=True)
        owner = 0 if self.persistent else os.getpid()
        state = {
            "tag": self.tag,
            "owner_pid": owner,
            "owner_start": proc_start_time(owner),
            "head_ns": self.head.netns,
            "worker_ns": self.worker.netns,
            "num_nodes": self.num_nodes,
            "address": self.address,
        }
        (STATE_ROOT / self.tag / "state.json").write_text(json.dumps(state))
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        if not self.persistent:
            atexit.register(self.down)
        try:
            self._make_links()
            self.start_node("head", timeout=timeout)
            self._start_workers(timeout)
            self.wait_nodes(self.num_nodes, timeout=timeout)
        except BaseException:
            self.down()
            raise

    def _make_links(self) -> None:
        for node in self.hosts:
            run_cmd(f"ip netns add {node.netns}")
        sw = self.switch_netns
        if sw is None:
            run_cmd(veth_cmd(self.head.netns, self.worker.netns))
        else:
            run_cmd(f"ip netns add {sw}")
            # STP is off (the default): a port forwards as soon as it is up.
            run_cmd(f"ip -n {sw} link add {BRIDGE} type bridge")
            for key in ("net.bridge.bridge-nf-call-iptables", "net.ipv6.conf.all.disable_ipv6"):
                # No netfilter pass per bridged packet, no IPv6 chatter on the ports.
                run_cmd(f"ip netns exec {sw} sysctl -qw {key}={int('ipv6' in key)}", check=False)
            for node in self.hosts:
                port = self.switch_port(node)
                run_cmd(veth_cmd(node.netns, sw, port))
                run_cmd(f"ip -n {sw} link set {port} master {BRIDGE}")
                run_cmd(f"ip -n {sw} link set {port} up")
            run_cmd(f"ip -n {sw} link set {BRIDGE} up")
        for node in self.hosts:
            run_cmd(f"ip -n {node.netns} link set lo up")
            run_cmd(f"ip -n {node.netns} addr add {node.ip}/24 dev {IFNAME}")
            run_cmd(f"ip -n {node.netns} link set {IFNAME} up")
            # No IPv6 on the link: no neighbour/router chatter in the byte counters.
            run_cmd(
                f"ip netns exec {node.netns} sysctl -qw net.ipv6.conf.{IFNAME}.disable_ipv6=1",
                check=False,
            )

    def _start_workers(self, timeout: float) -> None:
        # The worker nodes join the head side by side (each `ray start` takes seconds).
        with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as pool:
            list(pool.map(lambda n: self.start_node(n.role, timeout=timeout), self.workers))

    def start_node(self, role: str, *, timeout: float = 120.0) -> None:
        """``ray start`` inside the node's namespace (head first; the workers join it)."""
        node = self.node(role)
        node.temp_dir.mkdir(parents=True, exist_ok=True)
        argv = (
            f"ip netns exec {node.netns} {ray_bin()} start --node-ip-address={node.ip}"
            f" --temp-dir={node.temp_dir} --num-cpus={self.num_cpus} --num-gpus=0"
            f" --object-store-memory={self.object_store_bytes} --disable-usage-stats"
        ).split()
        if role == "head":
            argv += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.address}"]
        log = STATE_ROOT / self.tag / f"ray-start-{role}.log"
        with log.open("a") as fh:
            proc = subprocess.run(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=str(STATE_ROOT / self.tag),
                timeout=timeout,
                check=False,
            )
        if proc.returncode != 0:
            tail = log.read_text()[-2000:]
            if SLOW_REGISTRATION in tail:  # the node may still register: wait_nodes() decides
                print(
                    f"netns_cluster: ray start ({role}) gave up waiting for the node to"
                    " register; waiting for it in wait_nodes()",
                    file=sys.stderr,
                )
                return
            raise NetnsClusterError(f"ray start ({role}) exited {proc.returncode}:\n{tail}")

    def wait_nodes(self, count: int, *, timeout: float = 60.0) -> list[dict[str, object]]:
        """Wait until ``count`` nodes are alive; record and return them (ip, node_id)."""
        res = self.run_driver(["-c", _PROBE, str(count), str(timeout)], timeout=timeout + 30)
        if not isinstance(res.result, list) or len(res.result) < count:
            raise NetnsClusterError(
                f"{count} Ray nodes did not come up (alive: {res.result}): {res.stderr[-2000:]}"
            )
        self.nodes = res.result
        return self.nodes

    def kill_node(self, role: str, *, sig: int = signal.SIGKILL) -> list[int]:
        """Kill every process of the node ``role`` at once with ``sig``; return their pids."""
        ns = self.node(role).netns
        pids = namespace_pids(ns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def down(self) -> None:
        """Tear everything down; safe to call twice, and from atexit."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)
        teardown(self.tag, keep_logs=os.environ.get("P2PMN_KEEP_LOGS") == "1")

    # ---- the link ------------------------------------------------------------------------
    def _cable_ends(self) -> list[tuple[str, str]]:
        # (namespace, interface) of each egress that tbf shapes: every node's p2pmn0, and
        # with a switch also its port towards each node.
        ends = [(node.netns, IFNAME) for node in self.hosts]
        if self.switch_netns is not None:
            ends += [(self.switch_netns, self.switch_port(node)) for node in self.hosts]
        return ends

    def shape(self, rate: str | int, *, burst: int | None = None, latency_ms: int = 50) -> int:
        """Shape both directions of every node's cable with a token bucket (tc tbf).

        Args:
            rate: ``"1gbit"``, ``"200mbit"`` or bits/s.
            burst: Bucket size in bytes; default 10 ms worth of ``rate`` (at least 64 KiB).
            latency_ms: Longest time a packet may wait in the bucket's queue.

        Returns:
            The rate in bits/s.
        """
        bps = parse_rate(rate)
        burst = burst or max(64 * 1024, bps // 8 // 100)
        for ns, dev in self._cable_ends():
            run_cmd(
                f"tc -n {ns} qdisc replace dev {dev} root tbf rate {bps}bit"
                f" burst {burst} latency {latency_ms}ms"
            )
        self.rate_bps = bps
        return bps

    def unshape(self) -> None:
        """Remove the token buckets from every cable."""
        for ns, dev in self._cable_ends():
            run_cmd(f"tc -n {ns} qdisc del dev {dev} root", check=False)
        self.rate_bps = None

    def link_stats(self, role: str, ifname: str = IFNAME) -> dict[str, int]:
        """Byte and packet counters of ``ifname`` (the veth end, or ``lo``) in a namespace."""
        out = run_cmd(f"ip -n {self.node(role).netns} -j -s link show dev {ifname}")
        stats = json.loads(out)[0]["stats64"]
        return {f"{d}_{k}": int(stats[d][k]) for d in ("tx", "rx") for k in ("bytes", "packets")}

    def qdisc_stats(self, role: str) -> str:
        """``tc -s qdisc show`` of the veth end of a node, as text."""
        return run_cmd(f"tc -n {self.node(role).netns} -s qdisc show dev {IFNAME}")

    # ---- drivers -------------------------------------------------------------------------
    def driver_argv(self, args: list[str], role: str = "head") -> list[str]:
        """``ip netns exec NS python ARGS`` for a driver in a node's namespace."""
        return ["ip", "netns", "exec", self.node(role).netns, sys.executable, *args]

    def start_driver(
        self, args: list[str], *, env: dict[str, str] | None = None, role: str = "head"
    ) -> Driver:
        """Start ``python ARGS`` in a namespace with RAY_ADDRESS set; do not wait for it."""
        full_env = self.env({"RAY_ADDRESS": self.address, **(env or {})})
        return Driver(self.driver_argv(args, role), env=full_env)

    def run_driver(
        self,
        args: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        role: str = "head",
    ) -> DriverResult:
        """Run ``python ARGS`` in a namespace and collect its ``P2PMN-RESULT`` JSON.

        Raises:
            NetnsClusterError: It ran past ``timeout`` (it is killed).
        """
        return self.start_driver(args, env=env, role=role).finish(timeout=timeout)


_PROBE = f"""
import json, sys, time, ray
count, timeout = int(sys.argv[1]), float(sys.argv[2])
ray.init(address="auto", logging_level="ERROR")
deadline = time.monotonic() + timeout
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= count or time.monotonic() > deadline:
        break
    time.sleep(0.5)
nodes = sorted(({{"ip": n["NodeManagerAddress"], "node_id": n["NodeID"]}} for n in alive),
               key=lambda n: n["ip"])
print("{RESULT_PREFIX}" + json.dumps(nodes), flush=True)
"""


def _cli_status() -> int:
    tags = known_tags()
    if not tags:
        print("no p2pmn clusters")
    for tag in tags:
        state = read_state(tag)
        owner = state.get("owner_pid")
        alive = (
            "persistent (CLI)"
            if not owner
            else (f"owner pid {owner} " + ("alive" if owner_alive(state) else "GONE (stale)"))
        )
        print(f"cluster {tag}: address {state.get('address', '?')}, {alive}")
        for ns in cluster_namespaces(tag):
            if ns.endswith("-s"):
                ports = run_cmd(f"ip -n {ns} -br link show master {BRIDGE}", check=False)
                print(f"  {ns}: switch, {len(ports.splitlines())} ports")
                continue
            addr = run_cmd(f"ip -n {ns} -br addr show dev {IFNAME}", check=False)
            qdisc = run_cmd(f"tc -n {ns} qdisc show dev {IFNAME}", check=False)
            print(
                f"  {ns}: {len(namespace_pids(ns))} processes; {addr.strip()}; "
                f"{qdisc.splitlines()[0] if qdisc else 'no qdisc'}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``up``, ``down``, ``status``, ``exec``."""
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="create a persistent cluster (until `down`)")
    p_up.add_argument("--tag", default="cli")
    p_up.add_argument("--rate", default=None, help="shape the link, e.g. 1gbit")
    p_up.add_argument("--num-cpus", type=int, default=4)
    p_up.add_argument("--nodes", type=int, default=2, help="nodes, the head included")
    p_down = sub.add_parser("down", help="tear down a cluster and every stale one")
    p_down.add_argument("--tag", default="cli")
    p_down.add_argument("--all", action="store_true", help="every p2pmn cluster, live or not")
    sub.add_parser("status", help="list clusters, their namespaces and processes")
    p_exec = sub.add_parser("exec", help="run `python ARGS...` as a driver in the head ns")
    p_exec.add_argument("--tag", default="cli")
    p_exec.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.cmd == "status":
        return _cli_status()
    if ns.cmd == "down":
        tags = known_tags() if ns.all else sorted({ns.tag, *cleanup_stale()})
        for tag in tags:
            teardown(tag)
            print(f"cluster {tag}: down")
        return 0
    cluster = NetnsCluster(
        tag=ns.tag,
        num_nodes=getattr(ns, "nodes", None) or int(str(read_state(ns.tag).get("num_nodes", 2))),
        num_cpus=getattr(ns, "num_cpus", 4),
        persistent=True,
    )
    if ns.cmd == "exec":
        args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
        env = cluster.env({"RAY_ADDRESS": cluster.address})
        return subprocess.call(cluster.driver_argv(args), env=env)
    try:
        cluster.up()
    except NetnsUnavailableError as exc:
        print(f"cannot make namespaces here: {exc}", file=sys.stderr)
        return 2
    if ns.rate:
        cluster.shape(ns.rate)
    hosts = ", ".join(f"{n.role} {n.netns} {n.ip}" for n in cluster.hosts)
    print(f"cluster {cluster.tag} up: {hosts}, RAY_ADDRESS={cluster.address}")
    for node in cluster.nodes:
        print(f"  node {node['ip']} {node['node_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
