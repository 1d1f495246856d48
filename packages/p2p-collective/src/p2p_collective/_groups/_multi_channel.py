"""MultiChannelProcessGroup: RLinf's group of independent channels, on p2p's own groups.

RLinf's ``MultiChannelProcessGroup`` is not a ``torch.distributed.ProcessGroup``: it
holds, per channel, one torch process group for each direction between two ranks and
one for broadcasts among all ranks, so that operations on different channels never
wait for each other; ``send``/``recv`` of a tensor are broadcasts within a two-rank
group. Here each channel is a p2p pair group (:class:`CollectiveGroup`, a queue and a
thread per direction, sizes checked by a header, peer death seen in seconds) and a
ranked N-member group (:class:`MultiCollectiveGroup`) for broadcasts.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from p2p_asyncwork import AsyncWork
from p2p_collective._errors import CollectiveError, CollectiveTimeoutError
from p2p_collective._groups._collective import Collective
from p2p_collective._groups._group import CollectiveGroup
from p2p_collective._groups._multi import MultiCollectiveGroup

_KEY = "p2p-mcpg"

T = TypeVar("T")


class MultiChannelProcessGroup:
    """Channels between this process and its peers that never wait for each other.

    The interface of RLinf's ``MultiChannelProcessGroup``: construct it with this
    member's rank and the number of channels, :meth:`init` it (a torch-style
    ``init_method``, or a p2p :class:`Collective` of this process), then move tensors
    with :meth:`send` / :meth:`recv` (two members) and :meth:`broadcast` (any number),
    each naming its channel. Operations on one channel run in call order; operations on
    different channels run independently.

    Each channel is a p2p pair group (its own queue and thread per direction; the
    receiver checks the sender's size in a header, so a mismatch is a
    :class:`FramingError`, never a crash) and, at the first broadcast on it, a ranked
    group of all members. Accelerator tensors travel through a host copy (pinned when
    CUDA is there); the receiving tensor gets the bytes when the operation completes.

    What differs from RLinf: no NCCL channels (host copies instead); sizes are checked;
    every operation takes a ``timeout``; ``group_info`` and ``options`` are accepted and
    not used. A failure is logged once on ``logger`` (naming the group and this rank) and
    raised unchanged, as in RLinf.

    Args:
        cur_rank: This member's rank (0 or 1 for send/recv).
        num_channels: Number of channels, >= 1.
        group_info: RLinf's ``CollectiveGroupInfo``; accepted, not used.
        logger: Where failures are logged (default ``p2p_collective.multi_channel``).

    Raises:
        TypeError, ValueError: ``cur_rank`` or ``num_channels`` is not a usable int.

    Example:
        >>> pg = MultiChannelProcessGroup(cur_rank=0, num_channels=2)  # doctest: +SKIP
        >>> pg.init("tcp://127.0.0.1:29600", world_size=2, rank=0, group_name="g")  # doctest: +SKIP
        >>> pg.send(torch.arange(4), CollectiveGroup.CPU, channel_id=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        cur_rank: int,
        num_channels: int,
        group_info: object = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._cur_rank = _int_at_least(cur_rank, "cur_rank", 0)
        self._num_channels = _int_at_least(num_channels, "num_channels", 1)
        self._peer_rank = 1 if self._cur_rank == 0 else 0
        self._group_info = group_info
        self._logger = logger if logger is not None else logging.getLogger(__name__)
        self._is_initialized = False
        self._group_name = ""
        self._world_size = 0
        self._collective: Collective | None = None
        self._owns_collective = False
        self._pairs: list[CollectiveGroup] = []
        self._bcast: list[MultiCollectiveGroup | None] = []

    @property
    def is_initialized(self) -> bool:
        """Whether :meth:`init` has completed (and :meth:`close` was not called)."""
        return self._is_initialized

    @property
    def num_channels(self) -> int:
        """Number of channels."""
        return self._num_channels

    @property
    def world_size(self) -> int:
        """Number of members (0 before :meth:`init`)."""
        return self._world_size

    def init(
        self,
        init_method: str | None = None,
        world_size: int = 2,
        rank: int | None = None,
        group_name: str = "mcpg",
        options: object = None,
        *,
        collective: Collective | None = None,
        host: str | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        """Meet the other members and set up the channels.

        Give ``init_method`` (``tcp://host:port``, rank 0 serving the store there, or
        ``env://``), or ``collective``, this process's p2p :class:`Collective` (its store
        is where the members meet). Two members learn each other's address here and
        their pair groups connect at their first operation; broadcast groups connect at
        the first broadcast of their channel.

        Args:
            init_method: A ``torch.distributed`` rendezvous URL (not with ``collective``).
            world_size: Number of members, >= 2 (send/recv need exactly 2).
            rank: This member's rank; default ``cur_rank``. Must equal ``cur_rank``.
            group_name: Name shared by all members, unique among the groups of a store.
            options: RLinf's ``CollectiveGroupOptions``; accepted, not used.
            collective: This process's Collective (instead of ``init_method``).
            host: Address of this machine the transport binds to, for ``init_method``
                (default: the one that reaches the store's host; 127.0.0.1 for loopback).
            timeout: Seconds to wait for the store and for the other member's address
                (None: no limit).

        Raises:
            ValueError: Neither or both of ``init_method`` and ``collective``, a bad
                ``world_size``/``rank``/``group_name``, or already initialized.
            CollectiveTimeoutError: The other member did not arrive within ``timeout``.
        """
        del options  # RLinf's accelerator options: no NCCL channels here
        if self._is_initialized:
            raise ValueError(f"group {self._group_name!r} is already initialized")
        if (init_method is None) == (collective is None):
            raise ValueError("give init_method (a rendezvous URL) or collective, exactly one")
        world = _int_at_least(world_size, "world_size", 2)
        rank = self._cur_rank if rank is None else _int_at_least(rank, "rank", 0)
        if rank != self._cur_rank or rank >= world:
            raise ValueError(
                f"rank: got {rank}; allowed: cur_rank ({self._cur_rank}), below world_size "
                f"({world})"
            )
        if not isinstance(group_name, str) or not group_name:
            raise ValueError(f"group_name: got {group_name!r}; allowed: a non-empty str")
        owned = collective is None
        if collective is None:
            assert init_method is not None
            collective = _own_collective(init_method, world, rank, group_name, host, timeout)
        try:
            pairs = self._meet(collective, group_name, rank, world, timeout)
        except BaseException:
            if owned:  # a failed init leaves nothing behind; it may be called again
                collective.close()
            raise
        self._collective, self._owns_collective = collective, owned
        self._group_name, self._world_size = group_name, world
        self._pairs = pairs
        self._bcast = [None] * self._num_channels
        self._is_initialized = True

    def _meet(
        self, collective: Collective, group_name: str, rank: int, world: int, timeout: float | None
    ) -> list[CollectiveGroup]:
        """Publish this member's address; for two members, build a pair group per channel."""
        store = collective._store
        store.set(f"{_KEY}/{group_name}/{rank}", collective.name)
        if world != 2:
            return []
        peer_key = f"{_KEY}/{group_name}/{self._peer_rank}"
        try:
            store.wait([peer_key], _delta(timeout))
        except Exception as exc:
            raise CollectiveTimeoutError(
                f"group {group_name!r}: member {self._peer_rank} did not arrive within "
                f"{timeout} s: {exc}"
            ) from exc
        peer = bytes(store.get(peer_key)).decode()
        return [
            collective.create_pair_group([collective.name, peer], f"{group_name}/ch{i}")
            for i in range(self._num_channels)
        ]

    # -- operations ----------------------------------------------------------------------

    def send(
        self,
        tensor: torch.Tensor,
        device: str,
        channel_id: int,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> AsyncWork[None] | None:
        """Send ``tensor`` to the other member on ``channel_id``; it calls :meth:`recv`.

        Args:
            tensor: A contiguous tensor, on CPU or an accelerator (sent from a host copy).
            device: ``CollectiveGroup.CPU`` or ``CollectiveGroup.ACCEL`` (RLinf's argument;
                where the tensor lives decides the path).
            channel_id: The channel, ``0 <= channel_id < num_channels``.
            async_op: Return an AsyncWork at once instead of ``None`` when done.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            None, or an AsyncWork.

        Raises:
            RuntimeError: Not initialized. ValueError: Bad channel, device or tensor, or
                the group has more than two members. CollectiveError: The transfer failed.
        """
        pair = self._pair(channel_id, device, "send")
        payload = _to_host(tensor, "send")
        return self._run(lambda: pair.send_tensor(payload, async_op, timeout=timeout), "send")

    def recv(
        self,
        tensor: torch.Tensor,
        device: str,
        channel_id: int,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> AsyncWork[torch.Tensor] | None:
        """Receive the other member's :meth:`send` on ``channel_id`` into ``tensor``.

        Args:
            tensor: The destination, with as many bytes as the sent tensor.
            device: As for :meth:`send`.
            channel_id: As for :meth:`send`.
            async_op: Return an AsyncWork (result: ``tensor``) instead of ``None``.
            timeout: As for :meth:`send`.

        Returns:
            None, or an AsyncWork.

        Raises:
            RuntimeError, ValueError: As for :meth:`send`. FramingError: The sizes differ.
            CollectiveError: The transfer failed.
        """
        pair = self._pair(channel_id, device, "recv")
        buf, finish = _landing(tensor, "recv")
        return self._run(
            lambda: _then(pair.recv_tensor(buf, async_op, timeout=timeout), finish),
            "recv",
        )

    def broadcast(
        self,
        tensor: torch.Tensor,
        device: str,
        channel_id: int,
        src: int,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> AsyncWork[torch.Tensor] | None:
        """Broadcast ``tensor`` of member ``src`` into ``tensor`` of every member.

        Args:
            tensor: Same shape and dtype on every member; written on all but ``src``.
            device: As for :meth:`send`.
            channel_id: As for :meth:`send`.
            src: Rank of the sending member.
            async_op: Return an AsyncWork (result: ``tensor``) instead of ``None``.
            timeout: As for :meth:`send`.

        Returns:
            None, or an AsyncWork.

        Raises:
            RuntimeError: Not initialized. ValueError: Bad channel, device, ``src`` or
                tensor. CollectiveError: The broadcast failed.
        """
        self._check(channel_id, device)
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self._world_size:
            raise ValueError(f"src: got {src!r}; allowed: a rank in 0..{self._world_size - 1}")
        group = self._bcast[channel_id]
        if group is None:
            assert self._collective is not None
            group = self._collective.join_ranked_group(
                f"{self._group_name}/bc{channel_id}", self._world_size, self._cur_rank
            )
            self._bcast[channel_id] = group
        if self._cur_rank == src:
            buf, finish = _to_host(tensor, "broadcast"), None
        else:
            buf, finish = _landing(tensor, "broadcast")
        ready = group
        return self._run(
            lambda: _then(ready.broadcast_tensor(buf, src, async_op, timeout=timeout), finish),
            "broadcast",
        )

    # -- state ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channels (and the Collective that :meth:`init` made). Idempotent."""
        self._is_initialized = False
        for pair in self._pairs:
            pair.close(timeout=1.0)
        for group in self._bcast:
            if group is not None:
                group.close(timeout=1.0)
        self._pairs, self._bcast = [], []
        if self._owns_collective and self._collective is not None:
            self._collective.close()
        self._collective = None

    def __enter__(self) -> MultiChannelProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "initialized" if self._is_initialized else "not initialized"
        return (
            f"<MultiChannelProcessGroup {self._group_name!r} rank={self._cur_rank} "
            f"channels={self._num_channels} {state}>"
        )

    # -- helpers -------------------------------------------------------------------------

    def _check(self, channel_id: int, device: str) -> None:
        if not self._is_initialized:
            raise RuntimeError("MultiChannelProcessGroup is not initialized: call init() first")
        if (
            isinstance(channel_id, bool)
            or not isinstance(channel_id, int)
            or not 0 <= channel_id < self._num_channels
        ):
            raise ValueError(
                f"channel_id: got {channel_id!r}; allowed: 0..{self._num_channels - 1}"
            )
        if device not in (CollectiveGroup.CPU, CollectiveGroup.ACCEL):
            raise ValueError(
                f"device: got {device!r}; allowed: {CollectiveGroup.CPU!r} or "
                f"{CollectiveGroup.ACCEL!r}"
            )

    def _pair(self, channel_id: int, device: str, what: str) -> CollectiveGroup:
        self._check(channel_id, device)
        if not self._pairs:
            raise ValueError(
                f"{what}: group {self._group_name!r} has {self._world_size} members; send and "
                f"recv need exactly 2 (use broadcast)"
            )
        return self._pairs[channel_id]

    def _run(self, op: Callable[[], T], what: str) -> T:
        try:
            result = op()
        except (TypeError, ValueError):
            raise
        except Exception as error:
            self._logger.error(
                "%s failed on ProcessGroup %s rank %d: %s",
                what,
                self._group_name,
                self._cur_rank,
                error,
            )
            raise
        return result


def _int_at_least(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: got {value}; allowed: >= {low}")
    return value


def _delta(timeout: float | None) -> datetime.timedelta:
    return datetime.timedelta(days=365) if timeout is None else datetime.timedelta(seconds=timeout)


def _check_tensor(tensor: object, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}(tensor): expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def _host_buffer(like: torch.Tensor) -> torch.Tensor:
    pin = torch.cuda.is_available()
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pin)


def _to_host(tensor: object, what: str) -> torch.Tensor:
    """The tensor to put on the wire: itself on CPU, else a host copy (pinned with CUDA)."""
    t = _check_tensor(tensor, what)
    if not t.is_contiguous():
        raise ValueError(
            f"{what}(tensor): tensor of shape {tuple(t.shape)} is not contiguous; allowed: a "
            f"contiguous tensor (call .contiguous())"
        )
    if t.device.type == "cpu":
        return t
    host = _host_buffer(t)
    host.copy_(t)
    return host


def _landing(
    tensor: object, what: str
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]:
    """Where received bytes land, and what copies them into ``tensor`` afterwards."""
    t = _check_tensor(tensor, what)
    if t.device.type == "cpu" and t.is_contiguous():
        return t, None
    buf = _host_buffer(t)

    def finish(_: torch.Tensor) -> torch.Tensor:
        t.copy_(buf)
        return t

    return buf, finish


def _then(
    result: AsyncWork[torch.Tensor] | torch.Tensor,
    finish: Callable[[torch.Tensor], torch.Tensor] | None,
) -> AsyncWork[torch.Tensor] | None:
    """The work (``finish`` chained on), or None once ``finish`` ran (a synchronous call)."""
    if isinstance(result, AsyncWork):  # the group returns a work exactly when async_op
        return result if finish is None else result.then(finish)
    if finish is not None:
        finish(result)
    return None


def _own_collective(
    init_method: str,
    world: int,
    rank: int,
    group_name: str,
    host: str | None,
    timeout: float | None,
) -> Collective:
    """A Collective on the store of a ``torch.distributed`` rendezvous URL."""
    try:
        store, _, _ = next(rendezvous(init_method, rank, world, timeout=_delta(timeout)))
    except Exception as exc:
        raise CollectiveError(
            f"init_method={init_method!r}: the rendezvous store is unreachable: {exc}"
        ) from exc
    prefixed: Any = dist.PrefixStore(f"{_KEY}/{group_name}", store)  # type: ignore[attr-defined]
    bind = host if host is not None else _local_address(init_method)
    return Collective(f"{group_name}[{rank}]", prefixed, host=bind, timeout=timeout)


def _local_address(init_method: str) -> str:
    """This machine's address toward the store's host (127.0.0.1 toward loopback)."""
    url = urllib.parse.urlparse(init_method)
    target = os.environ.get("MASTER_ADDR") if url.scheme == "env" else url.hostname
    if target is None:
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(target).is_loopback:
            return "127.0.0.1"
    except ValueError:
        if target == "localhost":
            return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])
