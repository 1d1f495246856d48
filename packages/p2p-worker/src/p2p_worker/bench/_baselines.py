"""The baselines, measured between the same two plain Ray actors.

* ``gloo``: raw ``torch.distributed`` point-to-point on a gloo group of the two actors.
  The receiver already holds buffers of the right sizes (the ideal case: no header,
  no metadata, no allocation on the clock); every tensor of the payload is one
  ``send``/``recv`` of its bytes, a plain object goes through ``send_object_list``.
* ``raycoll``: Ray's collective library, ``ray.util.collective`` ``send``/``recv`` on a
  group of the two actors (backend ``"gloo"``: Ray's torch-gloo group, no pygloo), one
  call per tensor of the payload into preallocated buffers, as a Ray user writes it.
  Ray's gloo group reuses the actors' process group when one exists (it does here: the
  gloo baseline's), so both baselines cross the same transport; the difference is
  Ray's own layer. Tensor payloads only: Ray's library does not move objects.
* ``ray``: Ray's object store. The sender ``ray.put`` s the payload and passes the
  reference to a method of the receiver actor, which ``ray.get`` s it and makes sure
  it owns every tensor (a tensor still backed by the object store is cloned). The
  method's return is the acknowledgement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import struct
from datetime import timedelta
from typing import Protocol, cast

import ray
import torch
import torch.distributed as dist
from ray.actor import ActorHandle

from p2p_worker._remote import RemoteMethod
from p2p_worker.bench._payloads import Payload, payload_nbytes, payload_tensors, payloads_equal
from p2p_worker.bench._results import Sample, samples_from_timings
from p2p_worker.bench._spec import Cell
from p2p_worker.bench._timing import (
    PayloadCache,
    PayloadMismatchError,
    receiver_loop,
    sender_loop,
)

_LOOPBACK = ("127.0.0.1", "localhost")
RAYCOLL_GROUP = "p2p-bench"
"""The name of the ``ray.util.collective`` group of the two baseline actors."""


def owned(payload: object) -> object:
    """Return ``payload`` with every tensor that does not own its memory cloned.

    A tensor deserialised zero-copy from Ray's object store is a view of shared
    memory (its storage is not resizable); the receiver of a real job would have to
    copy it before writing to it or releasing the object, so the baseline pays for that.
    """

    def fix(t: object) -> object:
        if isinstance(t, torch.Tensor) and not t.untyped_storage().resizable():
            return t.clone()
        return t

    if isinstance(payload, torch.Tensor):
        return fix(payload)
    if isinstance(payload, list):
        return [fix(t) for t in payload]
    if isinstance(payload, dict):
        return {k: fix(v) for k, v in payload.items()}
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        changes = {f.name: fix(getattr(payload, f.name)) for f in dataclasses.fields(payload)}
        return dataclasses.replace(payload, **changes)
    return payload


def _node_ip() -> str:
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def interface_of(ip: str) -> str | None:
    """Name of the local network interface holding IPv4 address ``ip`` (Linux), else None.

    Example:
        >>> interface_of("127.0.0.1")
        'lo'
    """
    try:
        import fcntl

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):  # pragma: no cover - not Linux
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), siocgifaddr, req)[20:24])
            except OSError:
                continue
            if addr == ip:
                return name
    return None


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class BaselineEndpoint:
    """One end of the baselines; runs as a plain Ray actor (see :func:`start_pair`)."""

    def __init__(self) -> None:
        self._cache = PayloadCache()
        self._peer: EndpointHandle | None = None
        self._ack = torch.zeros(1, dtype=torch.int64)

    def node(self) -> tuple[str, str]:
        """``(node_ip, node_id)`` of this actor."""
        ctx = ray.get_runtime_context()
        return _node_ip(), ctx.get_node_id()

    def free_port(self) -> int:
        """A TCP port free on this node's IP, for the gloo rendezvous."""
        with socket.socket() as sock:
            sock.bind((_node_ip(), 0))
            return int(sock.getsockname()[1])

    def set_peer(self, peer: EndpointHandle) -> None:
        """Remember the other actor's handle (used by the Ray object store baseline)."""
        self._peer = peer

    def init_gloo(self, rank: int, master_ip: str, port: int, timeout_s: float) -> None:
        """Join the two-member gloo group (both actors call this concurrently).

        Gloo is pointed at the interface that holds this node's Ray IP (``lo`` on an
        embedded cluster), so the baseline crosses the same link as the p2p workers.
        """
        iface = "lo" if master_ip in _LOOPBACK else interface_of(_node_ip())
        if iface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = iface
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master_ip}:{port}",
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=timeout_s),
        )

    def close(self) -> None:
        """Leave Ray's collective group and the gloo group."""
        import ray.util.collective as col

        if col.is_group_initialized(RAYCOLL_GROUP):  # type: ignore[no-untyped-call]
            col.destroy_collective_group(RAYCOLL_GROUP)
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- torch.distributed gloo ---------------------------------------------------------

    def gloo_send(self, kind: str, size: int, reps: int) -> tuple[int, list[float]]:
        """Sender side of a gloo cell; returns ``(nbytes, seconds per repetition)``."""
        payload = self._cache.get(kind, size)
        tensors = [_byte_view(t) for t in payload_tensors(payload)]
        ack = torch.zeros(1, dtype=torch.int64)

        def send() -> None:
            if tensors:
                for t in tensors:
                    dist.send(t, dst=1)
            else:
                dist.send_object_list([payload], dst=1)

        def wait_ack() -> None:
            dist.recv(ack, src=1)

        return payload_nbytes(payload), sender_loop(send, wait_ack, reps)

    def gloo_recv(self, kind: str, size: int, reps: int) -> None:
        """Receiver side of a gloo cell (buffers preallocated, outside the clock)."""
        expected = self._cache.get(kind, size)
        templates = payload_tensors(expected)
        buffers = [torch.empty_like(_byte_view(t)) for t in templates]

        def receive() -> object:
            if not templates:
                box: list[object] = [None]
                dist.recv_object_list(box, src=0)
                return box[0]
            for b in buffers:
                dist.recv(b, src=0)
            got = [b.view(t.dtype).view(t.shape) for b, t in zip(buffers, templates, strict=True)]
            return _rebuild(expected, got)

        def send_ack() -> None:
            dist.send(self._ack, dst=0)

        receiver_loop(receive, send_ack, reps, expected, f"gloo {kind} {size}")

    # -- ray.util.collective ------------------------------------------------------------

    def init_raycoll(self, rank: int) -> None:
        """Join Ray's collective group of the two actors (both call this at once)."""
        import ray.util.collective as col

        # Ray annotates backend as its Backend class; its values are strings such as this.
        col.init_collective_group(2, rank, backend="gloo", group_name=RAYCOLL_GROUP)  # type: ignore[arg-type]

    def raycoll_send(self, kind: str, size: int, reps: int) -> tuple[int, list[float]]:
        """Sender side of a ``ray.util.collective`` cell; returns ``(nbytes, seconds)``."""
        import ray.util.collective as col

        payload = self._cache.get(kind, size)
        tensors = [_byte_view(t) for t in payload_tensors(payload)]
        ack = torch.zeros(1, dtype=torch.int64)

        def send() -> None:
            for t in tensors:
                col.send(t, 1, RAYCOLL_GROUP)

        def wait_ack() -> None:
            col.recv(ack, 1, RAYCOLL_GROUP)

        return payload_nbytes(payload), sender_loop(send, wait_ack, reps)

    def raycoll_recv(self, kind: str, size: int, reps: int) -> None:
        """Receiver side of a ``ray.util.collective`` cell (buffers preallocated)."""
        import ray.util.collective as col

        expected = self._cache.get(kind, size)
        templates = payload_tensors(expected)
        buffers = [torch.empty_like(_byte_view(t)) for t in templates]

        def receive() -> object:
            for b in buffers:
                col.recv(b, 0, RAYCOLL_GROUP)
            got = [b.view(t.dtype).view(t.shape) for b, t in zip(buffers, templates, strict=True)]
            return _rebuild(expected, got)

        def send_ack() -> None:
            col.send(self._ack, 0, RAYCOLL_GROUP)

        receiver_loop(receive, send_ack, reps, expected, f"raycoll {kind} {size}")

    # -- Ray object store ---------------------------------------------------------------

    def ray_send(
        self, kind: str, size: int, reps: int, timeout_s: float
    ) -> tuple[int, list[float]]:
        """Sender side of a Ray object store cell; returns ``(nbytes, seconds)``."""
        payload = self._cache.get(kind, size)
        pending: list[ray.ObjectRef[int]] = []
        peer = self._peer
        if peer is None:
            raise RuntimeError("BaselineEndpoint.ray_send: call set_peer() first")
        first = [True]

        def send() -> None:
            ref = ray.put(payload)
            pending.append(peer.ray_consume.remote([ref], kind, size, first[0]))
            first[0] = False
            del ref

        def wait_ack() -> None:
            ray.get(pending.pop(), timeout=timeout_s)

        return payload_nbytes(payload), sender_loop(send, wait_ack, reps)

    def ray_consume(
        self, refs: list[ray.ObjectRef[Payload]], kind: str, size: int, check: bool
    ) -> int:
        """Receiver side of one Ray object store transfer; the return value is the ack."""
        got = owned(ray.get(refs[0]))
        if check and not payloads_equal(got, self._cache.get(kind, size)):
            raise PayloadMismatchError(f"ray {kind} {size}: the received payload differs")
        return 1


class EndpointHandle(Protocol):
    """A Ray actor handle of a :class:`BaselineEndpoint`: its methods, called remotely."""

    node: RemoteMethod[[], tuple[str, str]]
    free_port: RemoteMethod[[], int]
    set_peer: RemoteMethod[[EndpointHandle], None]
    init_gloo: RemoteMethod[[int, str, int, float], None]
    init_raycoll: RemoteMethod[[int], None]
    close: RemoteMethod[[], None]
    gloo_send: RemoteMethod[[str, int, int], tuple[int, list[float]]]
    gloo_recv: RemoteMethod[[str, int, int], None]
    raycoll_send: RemoteMethod[[str, int, int], tuple[int, list[float]]]
    raycoll_recv: RemoteMethod[[str, int, int], None]
    ray_send: RemoteMethod[[str, int, int, float], tuple[int, list[float]]]
    ray_consume: RemoteMethod[[list[ray.ObjectRef[Payload]], str, int, bool], int]


def _rebuild(template: Payload, tensors: list[torch.Tensor]) -> Payload:
    """Put received tensors back into the structure of ``template``."""
    if isinstance(template, torch.Tensor):
        return tensors[0]
    if isinstance(template, list):
        return list(tensors)
    if isinstance(template, dict):
        return dict(zip(template, tensors, strict=True))
    names = [
        f.name
        for f in dataclasses.fields(template)
        if isinstance(getattr(template, f.name), torch.Tensor)
    ]
    # only the tensor fields change; mypy checks the tensors against every field's type
    return dataclasses.replace(template, **dict(zip(names, tensors, strict=True)))  # type: ignore[arg-type]


class BaselinePair:
    """The two baseline actors, with a gloo group between them.

    Args:
        timeout: seconds any single step may take.
        sender_node / receiver_node: Ray node ids to pin the actors to (the nodes of the
            p2p workers, so both methods cross the same link); ``None`` lets Ray choose.
    """

    def __init__(
        self,
        *,
        timeout: float,
        sender_node: str | None = None,
        receiver_node: str | None = None,
    ) -> None:
        self.timeout = timeout
        actor_cls = ray.remote(num_cpus=0)(BaselineEndpoint)
        # Ray types a handle's methods as the class's own; what they are is remote calls
        self.sender = cast("EndpointHandle", actor_cls.options(**_placement(sender_node)).remote())
        self.receiver = cast(
            "EndpointHandle", actor_cls.options(**_placement(receiver_node)).remote()
        )
        try:
            ip, _ = ray.get(self.sender.node.remote(), timeout=timeout)
            port = ray.get(self.sender.free_port.remote(), timeout=timeout)
            ray.get(
                [
                    self.sender.init_gloo.remote(0, ip, port, timeout),
                    self.receiver.init_gloo.remote(1, ip, port, timeout),
                    self.sender.set_peer.remote(self.receiver),
                ],
                timeout=timeout,
            )
            ray.get(
                [self.sender.init_raycoll.remote(0), self.receiver.init_raycoll.remote(1)],
                timeout=timeout,
            )
        except BaseException:
            self.close()
            raise

    def run_cell(self, cell: Cell, reps: int) -> list[Sample]:
        """Measure one baseline cell; returns its samples."""
        if cell.method == "gloo":
            recv = self.receiver.gloo_recv.remote(cell.kind, cell.size, reps)
            send = self.sender.gloo_send.remote(cell.kind, cell.size, reps)
            (nbytes, secs), _ = ray.get([send, recv], timeout=self.timeout)
        elif cell.method == "raycoll":
            recv = self.receiver.raycoll_recv.remote(cell.kind, cell.size, reps)
            send = self.sender.raycoll_send.remote(cell.kind, cell.size, reps)
            (nbytes, secs), _ = ray.get([send, recv], timeout=self.timeout)
        elif cell.method == "ray":
            nbytes, secs = ray.get(
                self.sender.ray_send.remote(cell.kind, cell.size, reps, self.timeout),
                timeout=self.timeout,
            )
        else:
            raise ValueError(f"cell.method: got {cell.method!r}; allowed: gloo, ray, raycoll")
        return samples_from_timings(cell, nbytes, secs)

    def close(self) -> None:
        """Leave the gloo group and stop both actors."""
        for actor in (self.sender, self.receiver):
            with contextlib.suppress(Exception):  # best effort: the actor is killed next
                ray.get(actor.close.remote(), timeout=10)
            ray.kill(cast("ActorHandle[BaselineEndpoint]", actor))  # the handle it is


def _placement(node_id: str | None) -> dict[str, object]:
    if node_id is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
