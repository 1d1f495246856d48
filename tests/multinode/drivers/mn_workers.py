"""Worker classes and payloads for the two-node p2p tests (imported by the driver and workers).

Ray adds the driver script's folder to every worker's ``sys.path``, and both "nodes"
share this machine's filesystem, so workers on either node import this module by name;
the dataclass payload must be importable for plain pickle on the receiving side.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch

from p2p_worker import Worker


@dataclass
class Sample:
    """A dataclass payload: tensor fields travel as tensors, the rest is pickled."""

    tokens: torch.Tensor
    mask: torch.Tensor
    step: int
    note: str


def payloads(seed: int) -> dict[str, Any]:
    """Every payload kind of ``send``/``recv``, deterministic for a seed."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "tensor": torch.randn(256, 1024, generator=gen),  # 1 MiB float32
        "large_tensor": torch.randint(0, 256, (16 * 1024**2,), dtype=torch.uint8, generator=gen),
        "empty_tensor": torch.empty(0, 3),
        "tensor_list": [
            torch.randint(0, 32000, (4096,), dtype=torch.int64, generator=gen),
            torch.randn(64, 64, generator=gen).half(),
            torch.rand(100, generator=gen) > 0.5,
        ],
        "tensor_tuple": (torch.arange(10), torch.ones(2, 2, dtype=torch.float64)),
        "tensor_dict": {"z": torch.arange(5), "a": torch.randn(3, 3, generator=gen)},
        "dataclass": Sample(torch.arange(128), torch.ones(128, dtype=torch.bool), 7, "seven"),
        "object": {"msg": "hello across the link", "numbers": list(range(10)), "nested": (1, "x")},
    }


def send_tensor_payload(seed: int) -> torch.Tensor:
    """The tensor sent with ``send_tensor`` (4 MiB float32)."""
    return torch.randn(1024, 1024, generator=torch.Generator().manual_seed(seed + 1))


def same(a: Any, b: Any) -> bool:
    """Exact structural equality: types, key order, dtypes, shapes and values."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return bool(a == b)


def tcp_peers() -> list[str]:
    """Remote IPv4 addresses of this process's established TCP connections."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    peers = []
    with open("/proc/self/net/tcp") as fh:
        next(fh)
        for line in fh:
            cols = line.split()
            state, inode = cols[3], cols[9]
            if state == "01" and inode in inodes:  # ESTABLISHED and ours
                raw = bytes.fromhex(cols[2].split(":")[0])
                peers.append(socket.inet_ntoa(struct.pack("<I", struct.unpack(">I", raw)[0])))
    return peers


class Peer(Worker):
    """A worker that reports where it runs and exchanges every payload kind."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: Any = None

    def where(self) -> dict[str, Any]:
        info = self.worker_info
        return {
            "rank": info.rank,
            "node_id": info.node_id,
            "ray_node_id": info.ray_node_id,
            "node_ip": info.node_ip,
            "address": info.address.get_name(),
            "pid": os.getpid(),
            "env": {k: os.environ.get(k) for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE")},
        }

    def send_all(self, dst_group: str, dst_rank: int, seed: int) -> list[str]:
        sent = []
        for kind, obj in payloads(seed).items():
            self.send(obj, dst_group_name=dst_group, dst_rank=dst_rank)
            sent.append(kind)
        work = self.send(payloads(seed)["tensor"], dst_group, dst_rank, async_op=True)
        work.wait(timeout=120)
        self.send_tensor(send_tensor_payload(seed), dst_group_name=dst_group, dst_rank=dst_rank)
        return sent

    def recv_all(self, src_group: str, src_rank: int, seed: int) -> dict[str, Any]:
        expected = payloads(seed)
        ok = {}
        for kind, obj in expected.items():
            ok[kind] = same(obj, self.recv(src_group_name=src_group, src_rank=src_rank))
        work = self.recv(src_group_name=src_group, src_rank=src_rank, async_op=True)
        ok["async_tensor"] = same(expected["tensor"], work.wait(timeout=120))
        buf = torch.empty(1024, 1024)
        self.recv_tensor(buf, src_group_name=src_group, src_rank=src_rank)
        ok["send_tensor"] = same(send_tensor_payload(seed), buf)
        return {"ok": ok, "tcp_peers": tcp_peers()}

    def ping(self, dst_group: str, dst_rank: int) -> bool:
        self.send("ping", dst_group_name=dst_group, dst_rank=dst_rank)
        return self.recv(src_group_name=dst_group, src_rank=dst_rank) == "pong"

    def pong(self, src_group: str, src_rank: int) -> bool:
        ok = self.recv(src_group_name=src_group, src_rank=src_rank) == "ping"
        self.send("pong", dst_group_name=src_group, dst_rank=src_rank)
        return ok

    def post_recv(self, src_group: str, src_rank: int) -> bool:
        self._pending = self.recv(src_group_name=src_group, src_rank=src_rank, async_op=True)
        return True

    def wait_pending(self, timeout: float) -> dict[str, Any]:
        try:
            value = self._pending.wait(timeout=timeout)
        except Exception as exc:
            from p2p_asyncwork import P2PError

            return {
                "error": type(exc).__name__,
                "message": str(exc)[:800],
                "is_p2p_error": isinstance(exc, P2PError),
                "is_timeout": isinstance(exc, TimeoutError),
                "at": time.time(),
            }
        return {"error": None, "value": repr(value)[:200], "at": time.time()}

    def send_after_peer_death(
        self, dst_group: str, dst_rank: int, timeout: float
    ) -> dict[str, Any]:
        start = time.time()
        try:
            self.send(
                torch.ones(1024), dst_group_name=dst_group, dst_rank=dst_rank, async_op=True
            ).wait(timeout=timeout)
        except Exception as exc:
            return {"error": type(exc).__name__, "seconds": time.time() - start}
        return {"error": None, "seconds": time.time() - start}

    # ---- channels (issue 7) ------------------------------------------------------------
    def channel_put(self, name: str, node_id: int, seed: int, count: int) -> int:
        channel = self.create_channel(name, node_id=node_id, maxsize=2)
        items = channel_items(seed, count)
        for item in items:
            channel.put(item)
        return len(items)

    def channel_get(self, name: str, seed: int, count: int) -> dict[str, Any]:
        channel = _connect_retry(self, name)
        got = [channel.get() for _ in range(count)]
        return {"ok": [same(a, b) for a, b in zip(channel_items(seed, count), got, strict=True)]}

    # ---- group calls ---------------------------------------------------------------------
    @Worker.timer("work")
    def work(self, fail_rank: int | None = None) -> dict[str, Any]:
        with self.worker_timer("inner"):
            time.sleep(0.05)
        if fail_rank is not None and self.worker_info.rank == fail_rank:
            raise RuntimeError(f"boom on rank {fail_rank}")
        return self.where()


def channel_items(seed: int, count: int) -> list[Any]:
    """Tensors, dicts and plain objects for a channel, in order."""
    gen = torch.Generator().manual_seed(seed)
    kinds = [
        lambda i: torch.randint(0, 32000, (1024 * 1024,), dtype=torch.int64, generator=gen),
        lambda i: {"i": torch.tensor([i]), "x": torch.randn(16, generator=gen)},
        lambda i: ("item", i),
    ]
    return [kinds[i % 3](i) for i in range(count)]


def _connect_retry(worker: Worker, name: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return worker.connect_channel(name)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
