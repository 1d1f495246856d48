"""Plain-Ray driver for the netns cluster: runs inside the head namespace, prints JSON.

Usage: python ray_driver.py placement | gloo NBYTES REPS | pending-recv | collective

Each command prints ``P2PMN-RESULT <json>`` once at the end; ``pending-recv`` also prints
``P2PMN-EVENT posted`` when a gloo receive is pending on the head node, and then waits for
the test to kill the worker node.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

RESULT_PREFIX = "P2PMN-RESULT "
EVENT_PREFIX = "P2PMN-EVENT "


def emit(obj: Any) -> None:
    print(RESULT_PREFIX + json.dumps(obj), flush=True)


def event(name: str) -> None:
    print(EVENT_PREFIX + name, flush=True)


@ray.remote(num_cpus=1)
class NodeActor:
    """One actor pinned to one node; speaks Ray object store and raw gloo."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._outcome: dict[str, Any] = {}

    def where(self) -> dict[str, str]:
        ctx = ray.get_runtime_context()
        return {"ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id()}

    def make(self, nbytes: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)

    def checksum(self, tensor: torch.Tensor) -> int:
        return int(tensor.to(torch.int64).sum())

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind((ray.util.get_node_ip_address(), 0))
            return int(s.getsockname()[1])

    def _init(self, rank: int, master: str, port: int) -> None:
        import torch.distributed as dist

        # Raw gloo baseline: pin its device to the veth explicitly.
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("P2PMN_IFNAME", "p2pmn0")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master}:{port}",
            rank=rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=60),
        )

    def gloo_transfer(self, rank: int, master: str, port: int, nbytes: int, reps: int) -> float:
        import torch.distributed as dist

        self._init(rank, master, port)
        buf = (
            torch.ones(nbytes, dtype=torch.uint8)
            if rank == 0
            else torch.empty(nbytes, dtype=torch.uint8)
        )
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            if rank == 0:
                dist.send(buf, 1)
            else:
                dist.recv(buf, 0)
        dist.barrier()
        elapsed = time.perf_counter() - start
        assert rank == 0 or int(buf.sum()) == nbytes
        dist.destroy_process_group()
        return elapsed

    def setup_pair(self, rank: int, master: str, port: int) -> bool:
        self._init(rank, master, port)
        import torch.distributed as dist

        dist.barrier()
        return True

    def post_recv(self, nbytes: int) -> bool:
        import torch.distributed as dist

        def body() -> None:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            try:
                dist.recv(buf, 1)
                self._outcome = {"error": None, "at": time.time()}
            except Exception as exc:
                self._outcome = {"error": f"{type(exc).__name__}: {exc}"[:500], "at": time.time()}

        self._thread = threading.Thread(target=body, daemon=True)
        self._thread.start()
        return True

    def outcome(self, timeout: float) -> dict[str, Any]:
        assert self._thread is not None
        self._thread.join(timeout)
        return self._outcome or {"error": None, "at": None, "still_pending": True}


@ray.remote(num_cpus=0)
class CollectivePeer:
    """p2p-collective alone (no p2p-worker): a Collective bound to this node's address."""

    def exchange(self, rank: int, store_host: str, store_port: int, seed: int) -> dict[str, Any]:
        from mn_payloads import payloads, same, send_tensor_payload, tcp_peers

        from p2p_collective import Collective

        store = dist_store(store_host, store_port)
        me, peer = f"mn_c{rank}", f"mn_c{1 - rank}"
        collective = Collective(me, store, host=ray.util.get_node_ip_address(), timeout=120)
        try:
            group = collective.create_collective_group([me, peer])
            ok: dict[str, bool] = {}
            for direction in (0, 1):  # rank 0 sends first, then rank 1
                expected = payloads(seed + direction)
                if rank == direction:
                    for obj in expected.values():
                        group.send(obj, timeout=120)
                    group.send_tensor(send_tensor_payload(seed), timeout=120)
                else:
                    for kind, obj in expected.items():
                        ok[kind] = same(obj, group.recv(timeout=120))
                    buf = torch.empty(1024, 1024)
                    group.recv_tensor(buf, timeout=120)
                    ok["send_tensor"] = same(send_tensor_payload(seed), buf)
            seen = tcp_peers()
            # Neither side closes before both have looked at their connections: the peer's
            # close would turn ours from ESTABLISHED to CLOSE_WAIT (a flake under load).
            store.set(f"mn_c/looked/{rank}", "1")
            store.wait([f"mn_c/looked/{1 - rank}"], datetime.timedelta(seconds=120))
            return {"ok": ok, "tcp_peers": seen, "host": collective.host}
        finally:
            collective.close()


def dist_store(host: str, port: int, server: bool = False) -> Any:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=120)
    return dist.TCPStore(host, port, is_master=server, timeout=timeout, wait_for_workers=False)


def cmd_collective() -> dict[str, Any]:
    nodes = alive_nodes()
    head_ip = os.environ["P2PMN_HEAD_IP"]
    # The driver holds the rendezvous store; port 0: the store binds a free port itself
    # (a port found free, closed and bound again later could be taken in between).
    server = dist_store(head_ip, 0, server=True)
    port = int(server.port)
    peers = [
        CollectivePeer.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["node_id"], soft=False)
        ).remote()
        for n in nodes
    ]
    res = ray.get([p.exchange.remote(r, head_ip, port, 11) for r, p in enumerate(peers)])
    del server
    return {"peers": res, "nodes": nodes}


def pinned(node_id: str) -> Any:
    return NodeActor.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        max_concurrency=4,
    ).remote()


def alive_nodes() -> list[dict[str, str]]:
    alive = [n for n in ray.nodes() if n["Alive"]]
    nodes = [{"ip": n["NodeManagerAddress"], "node_id": n["NodeID"]} for n in alive]
    return sorted(nodes, key=lambda n: n["ip"])


def pair() -> tuple[Any, Any, list[dict[str, Any]]]:
    nodes = alive_nodes()
    head_ip = os.environ["P2PMN_HEAD_IP"]
    head = next(n for n in nodes if n["ip"] == head_ip)
    other = next(n for n in nodes if n["ip"] != head_ip)
    return pinned(head["node_id"]), pinned(other["node_id"]), nodes


def cmd_placement() -> dict[str, Any]:
    a, b, nodes = pair()
    where = ray.get([a.where.remote(), b.where.remote()])
    nbytes = 32 * 1024**2
    ref = b.make.remote(nbytes, 7)
    ray.wait([ref], fetch_local=False)
    start = time.perf_counter()
    remote_sum = ray.get(a.checksum.remote(ref))
    elapsed = time.perf_counter() - start
    local_sum = int(ray.get(b.make.remote(nbytes, 7)).to(torch.int64).sum())
    return {
        "nodes": nodes,
        "actors": where,
        "driver_node_id": ray.get_runtime_context().get_node_id(),
        "nbytes": nbytes,
        "checksum_ok": remote_sum == local_sum,
        "object_store_seconds": elapsed,
    }


def cmd_gloo(nbytes: int, reps: int) -> dict[str, Any]:
    a, b, _ = pair()
    master = os.environ["P2PMN_HEAD_IP"]
    port = ray.get(a.free_port.remote())
    times = ray.get(
        [
            a.gloo_transfer.remote(0, master, port, nbytes, reps),
            b.gloo_transfer.remote(1, master, port, nbytes, reps),
        ]
    )
    seconds = max(times)
    return {"nbytes": nbytes * reps, "seconds": seconds, "bytes_per_s": nbytes * reps / seconds}


def cmd_pending_recv() -> dict[str, Any]:
    a, b, _ = pair()
    master = os.environ["P2PMN_HEAD_IP"]
    port = ray.get(a.free_port.remote())
    ray.get([a.setup_pair.remote(0, master, port), b.setup_pair.remote(1, master, port)])
    ray.get(a.post_recv.remote(1024))
    time.sleep(0.5)  # the receive thread is inside gloo by now
    event("posted")
    return ray.get(a.outcome.remote(60.0), timeout=90)


def main() -> None:
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    cmd = sys.argv[1]
    if cmd == "placement":
        emit(cmd_placement())
    elif cmd == "gloo":
        emit(cmd_gloo(int(sys.argv[2]), int(sys.argv[3])))
    elif cmd == "collective":
        emit(cmd_collective())
    elif cmd == "pending-recv":
        emit(cmd_pending_recv())
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main()
