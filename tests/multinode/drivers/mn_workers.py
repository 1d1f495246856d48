"""Worker classes for the two-node p2p-worker tests (imported by the driver and workers)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from mn_payloads import payloads, same, send_tensor_payload, tcp_peers

from p2p_worker import Worker


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
