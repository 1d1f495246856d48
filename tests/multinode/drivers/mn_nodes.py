"""Worker class for the four-node tests: weight sync, N-member collectives, keyed channels.

Each method that moves data reads its node's ``p2pmn0`` byte counters before and after
(``/proc/self/net/dev`` shows the counters of the reading process's network namespace,
that is of the node the worker runs on), so the test sees what crossed each node's cable
while that operation ran.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import ray
import torch
from mn_workers import Peer, channel_items, same

from p2p_worker import PushReport

IFNAME = "p2pmn0"
TIMEOUT = 180.0


def net_counters(ifname: str = IFNAME) -> dict[str, int]:
    """``rx_bytes`` and ``tx_bytes`` of ``ifname`` in this process's network namespace."""
    with open("/proc/self/net/dev") as fh:
        for line in fh:
            name, _, data = line.partition(":")
            if name.strip() == ifname:
                cols = data.split()
                return {"rx_bytes": int(cols[0]), "tx_bytes": int(cols[8])}
    raise RuntimeError(f"no interface {ifname!r} in this network namespace")


def _since(before: dict[str, int]) -> dict[str, int]:
    now = net_counters()
    return {k: now[k] - before[k] for k in before}


def model_state(nbytes: int, seed: int) -> dict[str, torch.Tensor]:
    """A model's state of about ``nbytes`` fp32 bytes: an embedding and square layers."""
    gen = torch.Generator().manual_seed(seed)
    side = 1024
    layers = max(1, nbytes // 4 // (side * side) - 2)
    state = {"embed.weight": torch.randn(2 * side, side, generator=gen)}
    for i in range(layers):
        state[f"layers.{i}.weight"] = torch.randn(side, side, generator=gen)
        state[f"layers.{i}.bias"] = torch.randn(side, generator=gen)
    state["step"] = torch.zeros(1, dtype=torch.int64)  # a buffer of another dtype
    return state


def digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every key and every byte of every tensor, in key order."""
    h = hashlib.sha256()
    for key, tensor in state.items():
        h.update(key.encode())
        h.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class NodePeer(Peer):
    """A trainer or rollout worker of the four-node scenario."""

    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, torch.Tensor] = {}

    def counters(self) -> dict[str, int]:
        """This node's cable counters now."""
        return net_counters()

    # ---- weight sync ---------------------------------------------------------------------
    def init_model(self, nbytes: int, seed: int, trainer: bool) -> int:
        """Build the model: the trainer's from ``seed``, a rollout's all zeros."""
        self.state = model_state(nbytes, seed)
        if not trainer:
            for tensor in self.state.values():
                tensor.zero_()
        return sum(t.numel() * t.element_size() for t in self.state.values())

    def push(self, version: int, targets: str) -> dict[str, Any]:
        """Take a "training step" (every value changes), push it as ``version``."""
        for key, tensor in self.state.items():
            tensor.add_(1 if key == "step" else 0.5)
        before = net_counters()
        report = self.push_weights(self.state, version, targets, delta=False, timeout=TIMEOUT)
        assert isinstance(report, PushReport)
        return {
            "version": report.version,
            "targets": report.targets,
            "failed": report.failed,
            "order": list(report.order),
            "buckets": report.buckets,
            "sent_bytes": report.sent_bytes,
            "full_bytes": report.full_bytes,
            "seconds": report.seconds,
            "digest": digest(self.state),
            "net": _since(before),
        }

    def pull(self, src_group: str) -> dict[str, Any]:
        """Pull the next version from rank 0 of ``src_group``; digest what is held."""
        before = net_counters()
        start = time.perf_counter()
        version = self.pull_weights(self.state, src_group, 0, timeout=TIMEOUT)
        return {
            "version": version,
            "seconds": time.perf_counter() - start,
            "digest": digest(self.state),
            "node_ip": self.worker_info.node_ip,
            "net": _since(before),
        }

    def state_digest(self) -> str:
        """The digest of the model this worker holds now."""
        return digest(self.state)

    # ---- the same copy the ways p2p-bench weights compares against --------------------
    def put_state(self) -> list[Any]:
        """``ray.put`` the model once; the reference, in a list so that Ray passes it on."""
        return [ray.put(self.state)]

    def get_state(self, refs: list[Any]) -> str:
        """``ray.get`` the model from the object store (Ray pulls it to this node)."""
        return digest(ray.get(refs[0]))

    def send_state(self, dst_group: str, ranks: int) -> int:
        """``Worker.send`` the whole model to each rank of ``dst_group``, one after another."""
        for rank in range(ranks):
            self.send(self.state, dst_group_name=dst_group, dst_rank=rank)
        return ranks

    def recv_state(self, src_group: str) -> str:
        """Receive a model sent by rank 0 of ``src_group``."""
        return digest(self.recv(src_group_name=src_group, src_rank=0))

    # ---- collectives ---------------------------------------------------------------------
    def collectives(self, members: list[str], numel: int) -> dict[str, Any]:
        """Allreduce (sum, max), allgather and broadcast over ``members``, values checked."""
        group = self.create_collective(members, timeout=TIMEOUT)
        n, rank = group.world_size, group.rank
        pattern = (torch.arange(numel) % 997).double()  # small integers: any order is exact
        group.barrier(timeout=TIMEOUT)
        before = net_counters()
        start = time.perf_counter()
        total = group.allreduce(pattern * (rank + 1), op="sum", timeout=TIMEOUT)
        seconds = time.perf_counter() - start
        net = _since(before)
        ok = {"allreduce_sum": torch.equal(total, pattern * (n * (n + 1) // 2))}
        top = group.allreduce(torch.full((1000,), float(rank)), op="max", timeout=TIMEOUT)
        ok["allreduce_max"] = torch.equal(top, torch.full((1000,), float(n - 1)))
        octet = int(self.worker_info.node_ip.rsplit(".", 1)[1])
        gathered = group.allgather(torch.tensor([rank, octet]), timeout=TIMEOUT)
        src = n - 1
        sent = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(src))
        got = group.broadcast(sent if rank == src else None, src=src, timeout=TIMEOUT)
        ok["broadcast"] = same(sent, got)
        group.close()
        return {
            "rank": rank,
            "world_size": n,
            "members": list(group.member_names),
            "node_ip": self.worker_info.node_ip,
            "gathered": [t.tolist() for t in gathered],
            "ok": ok,
            "allreduce_bytes": numel * 8,
            "allreduce_seconds": seconds,
            "net": net,
        }

    # ---- channels ------------------------------------------------------------------------
    def put_keyed(self, name: str, key: str, seed: int, count: int) -> dict[str, Any]:
        """Put ``channel_items(seed, count)`` under ``key`` into channel ``name``."""
        channel = self.connect_channel(name, timeout=TIMEOUT)
        for item in channel_items(seed, count):
            channel.put(item, weight=1, key=key, timeout=TIMEOUT)
        return {"put": count, "node_ip": self.worker_info.node_ip}

    def get_keyed(self, name: str, keys: dict[str, int], count: int) -> dict[str, Any]:
        """Get ``count`` items of each key (key -> its producer's seed), in order, checked."""
        channel = self.connect_channel(name, timeout=TIMEOUT)
        ok = {}
        for key, seed in keys.items():
            got = [channel.get(key, timeout=TIMEOUT) for _ in range(count)]
            ok[key] = [same(a, b) for a, b in zip(channel_items(seed, count), got, strict=True)]
        return {"ok": ok, "node_ip": self.worker_info.node_ip}
