"""The processes of ``p2p-bench weights``: a trainer, its rollout workers, Ray's baselines.

:class:`WeightsSource` is the trainer: fp32 master weights taking real AdamW steps
(:class:`~p2p_worker.bench._model.WeightSteps`), the bf16 copy of the current version
held for the methods that send a whole state dict. :class:`WeightsTarget` is a rollout
worker holding its own bf16 copy of the model, which every method writes in place. Both
are p2p :class:`~p2p_worker.Worker` s, so the same two groups run every method: N full
``Worker.send`` s (RLinf's way), ``ray.put`` once and N ``ray.get``, a torch.distributed
gloo broadcast and a ``ray.util.collective`` broadcast. Ray Direct Transport needs an
actor method declared with ``@ray.method(tensor_transport=...)``, which a Worker's
methods are not, so it runs between two plain actors of its own
(:class:`RdtSource`, :class:`RdtTarget`) that take the trainer's version from the object
store first (not timed).

After each transfer a target returns the checksum of everything it holds; the driver
compares it with the trainer's (``exact``).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import zlib
from collections.abc import Mapping
from typing import Protocol, TypedDict

import ray
import torch

from p2p_compress import tensor_checksum
from p2p_worker import PushReport, Worker
from p2p_worker.bench._baselines import interface_of
from p2p_worker.bench._model import SHAPES, Decoder, WeightSteps

RAY_COLLECTIVE_GROUP = "p2p_wbench_col"

StateRefs = list["ray.ObjectRef[dict[str, torch.Tensor]]"]
"""The trainer's state dict in Ray's object store: its reference, inside a list (so that
Ray hands the reference itself, not the state dict, to the method it is passed to)."""


class VersionFacts(TypedDict):
    """What the trainer's step made: the version, its cost and how much of it changed."""

    version: int
    train_seconds: float
    changed: float
    checksum: int
    full_bytes: int
    loss: float


class PushFacts(TypedDict):
    """What p2p's push of one version sent (a ``PushReport`` as plain values)."""

    sent_bytes: int
    shared_bytes: int
    modes: dict[str, int]
    base_bytes: int
    seconds: float


class Broadcaster(Protocol):
    """What the gloo broadcast method uses of ``torch.distributed``."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> object:
        """Broadcast ``tensor`` from rank ``src`` to every rank, in place."""
        ...


def state_checksum(state: Mapping[str, torch.Tensor]) -> int:
    """One checksum of every tensor's bytes, in key order (``p2p_compress.tensor_checksum``)."""
    crc = 0
    for key in sorted(state):
        t = state[key].detach().contiguous().reshape(-1)
        crc = zlib.crc32(key.encode(), crc)
        crc = zlib.crc32(tensor_checksum(t).to_bytes(8, "little"), crc)
    return crc


def empty_state(shape_name: str, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Zeroed tensors of the model's parameters (a tied one once), as a rollout worker holds."""
    with torch.device("meta"):  # shapes only: no memory for the model itself
        model = Decoder(SHAPES[shape_name])
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}


def _copy_into(own: dict[str, torch.Tensor], got: Mapping[str, torch.Tensor]) -> None:
    if sorted(own) != sorted(got):
        raise ValueError(f"state dict keys differ: {sorted(set(own) ^ set(got))[:5]}")
    for key, t in own.items():
        t.copy_(got[key])


def node_ip() -> str:
    """This process's node address, as Ray knows it."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def use_node_interface() -> None:
    """Point gloo at the interface of this node's Ray address (unless the user already did).

    Without ``GLOO_SOCKET_IFNAME``, gloo binds the address its hostname resolves to, which
    on a multi-node cluster may not be reachable from the other nodes; a user of
    torch.distributed or ``ray.util.collective`` sets it, so the baselines do too.
    """
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        name = interface_of(node_ip())
        if name is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = name


def _gloo_group(addr: str, port: int, rank: int, world: int, timeout: float) -> Broadcaster:
    """A torch.distributed gloo group of this benchmark (the default group, made once)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        use_node_interface()
        store = dist.TCPStore(  # type: ignore[attr-defined]
            addr, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=timeout)
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
    return dist


class WeightsSource(Worker):
    """The trainer: fp32 masters, real AdamW steps, the bf16 copy of the current version.

    Args:
        shape_name: A key of :data:`~p2p_worker.bench._model.SHAPES`.
        lr: AdamW learning rate.
        seed: Seed of the weights and the data.
    """

    def __init__(self, shape_name: str, lr: float, seed: int) -> None:
        super().__init__()
        self.trainer = WeightSteps(SHAPES[shape_name], lr=lr, seed=seed)
        self.current = self.trainer.weights()
        self.version = 0

    def step(self) -> VersionFacts:
        """One training step; the new version's facts."""
        t0 = time.perf_counter()
        self.trainer.train()
        changed = self.trainer.refresh(self.current)  # in place: no second bf16 copy
        self.version += 1
        return {
            "version": self.version,
            "train_seconds": time.perf_counter() - t0,
            "changed": changed,
            "checksum": state_checksum(self.current),
            "full_bytes": sum(t.numel() * t.element_size() for t in self.current.values()),
            "loss": self.trainer.last_loss,
        }

    def send_all(self, dst_group: str, targets: int, timeout: float, serial: bool = False) -> None:
        """N full sends: the whole state dict to each target, all posted at once.

        ``serial``: one target after another instead. On a shared emulated egress the
        total is the same (N copies through one NIC either way), and only one target at
        a time holds the second copy a receive makes (seven at once do not fit beside a
        0.5B trainer on a 24 GB machine).
        """
        if serial:
            for rank in range(targets):
                self.send(self.current, dst_group, rank, timeout=timeout)
            return
        works = [self.send(self.current, dst_group, rank, async_op=True) for rank in range(targets)]
        for work in works:
            work.wait(timeout=timeout)

    def push_p2p(
        self, dst_group: str, sync: str, delta: bool, timeout: float, packed: bool = False
    ) -> PushFacts:
        """p2p's weight sync: push the fp32 masters as this version (cast per bucket).

        ``packed``: full buckets go compressed without loss (``compress_full``).
        """
        report = self.push_weights(
            self.trainer.model,
            self.version,
            dst_group,
            sync=sync,
            delta=delta,
            timeout=timeout,
            compress_full=packed,
        )
        assert isinstance(report, PushReport)  # async_op=False
        if report.failed:
            raise RuntimeError(f"push of version {self.version} failed: {report.failed}")
        return {
            "sent_bytes": report.sent_bytes,
            "shared_bytes": report.shared_bytes,
            "modes": dict(report.modes),
            "base_bytes": report.base_bytes,
            "seconds": report.seconds,
        }

    def node_ip(self) -> str:
        """The trainer's node address."""
        return node_ip()

    def rendezvous(self) -> tuple[str, int]:
        """Where the gloo broadcast meets: this node's address and a port free on it."""
        addr = node_ip()
        with socket.socket() as s:
            s.bind((addr, 0))
            return addr, int(s.getsockname()[1])

    def put_object(self) -> StateRefs:
        """``ray.put`` of the state dict once; the reference travels inside a list."""
        return [ray.put(self.current)]

    def gloo_broadcast(self, addr: str, port: int, world: int, timeout: float) -> None:
        """torch.distributed gloo broadcast of every tensor from rank 0 (this worker)."""
        dist = _gloo_group(addr, port, 0, world, timeout)
        for key in sorted(self.current):
            dist.broadcast(self.current[key], src=0)

    def ray_collective_broadcast(self, world: int) -> None:
        """``ray.util.collective`` broadcast of every tensor from rank 0 (this worker)."""
        import ray.util.collective as col

        if not col.is_group_initialized(RAY_COLLECTIVE_GROUP):  # type: ignore[no-untyped-call]
            use_node_interface()
            col.init_collective_group(world, 0, "gloo", RAY_COLLECTIVE_GROUP)  # type: ignore[arg-type]
        for key in sorted(self.current):
            col.broadcast(self.current[key], 0, RAY_COLLECTIVE_GROUP)


class WeightsTarget(Worker):
    """A rollout worker: its own bf16 copy of the model, written in place by every method.

    Args:
        shape_name: A key of :data:`~p2p_worker.bench._model.SHAPES`.
    """

    def __init__(self, shape_name: str) -> None:
        super().__init__()
        self.weights = empty_state(shape_name)
        self.version = 0

    def node_ip(self) -> str:
        """This rollout worker's node address."""
        return node_ip()

    def checksum(self) -> int:
        """The checksum of what this worker holds."""
        return state_checksum(self.weights)

    def recv_one(self, src_group: str, timeout: float) -> None:
        """Take one full state dict from the trainer (the N-sends method)."""
        got = self.recv(src_group, 0, timeout=timeout)
        _copy_into(self.weights, got)

    def pull_p2p(self, src_group: str, sync: str, timeout: float) -> int:
        """p2p's weight sync: pull the next version into this worker's own tensors.

        Returns:
            How many of its buckets this worker read from a same-node holder's arena.
        """
        version = self.pull_weights(self.weights, src_group, 0, sync=sync, timeout=timeout)
        assert isinstance(version, int)  # async_op=False
        self.version = version
        receiver = self.weight_receiver(sync)
        stats = getattr(receiver, "last_stats", None) or {}
        return int(stats.get("modes", {}).get("lent", 0))

    def get_object(self, refs: StateRefs) -> None:
        """``ray.get`` the trainer's state dict and copy it in."""
        state: dict[str, torch.Tensor] = ray.get(refs[0])
        _copy_into(self.weights, state)

    def gloo_broadcast(self, addr: str, port: int, world: int, timeout: float) -> None:
        """Receive every tensor of the gloo broadcast into this worker's own tensors."""
        dist = _gloo_group(addr, port, self._rank + 1, world, timeout)
        for key in sorted(self.weights):
            dist.broadcast(self.weights[key], src=0)

    def ray_collective_broadcast(self, world: int) -> None:
        """Receive every tensor of the ``ray.util.collective`` broadcast in place."""
        import ray.util.collective as col

        if not col.is_group_initialized(RAY_COLLECTIVE_GROUP):  # type: ignore[no-untyped-call]
            use_node_interface()
            rank = self._rank + 1
            col.init_collective_group(world, rank, "gloo", RAY_COLLECTIVE_GROUP)  # type: ignore[arg-type]
        for key in sorted(self.weights):
            col.broadcast(self.weights[key], 0, RAY_COLLECTIVE_GROUP)


@ray.remote(num_cpus=0)
class RdtSource:
    """Ray Direct Transport's sender: an actor method that returns the state dict over gloo."""

    def __init__(self) -> None:
        use_node_interface()
        self.current: dict[str, torch.Tensor] = {}

    def node_ip(self) -> str:
        """This actor's node address."""
        return node_ip()

    def load(self, refs: StateRefs) -> int:
        """Take the trainer's version from the object store (not timed)."""
        self.current = {k: v.clone() for k, v in ray.get(refs[0]).items()}
        return state_checksum(self.current)

    @ray.method(tensor_transport="gloo")
    def weights(self) -> dict[str, torch.Tensor]:
        """The state dict, moved to the caller by Ray Direct Transport."""
        return self.current


# A receiver needs Ray's transfer thread too, which only a method declared with a tensor
# transport or this option starts (without it the transfer waits out Ray's 60 s timeout).
@ray.remote(num_cpus=0, enable_tensor_transport=True)  # type: ignore[call-overload]
class RdtTarget:
    """Ray Direct Transport's receiver: copies what arrives into its own tensors."""

    def __init__(self, shape_name: str) -> None:
        use_node_interface()
        self.weights = empty_state(shape_name)

    def node_ip(self) -> str:
        """This actor's node address."""
        return node_ip()

    def take(self, state: dict[str, torch.Tensor]) -> None:
        """Copy the state dict Ray handed over into this actor's tensors."""
        _copy_into(self.weights, state)

    def checksum(self) -> int:
        """The checksum of what this actor holds."""
        return state_checksum(self.weights)
