"""What every worker process is: identity, send/recv and collectives (no groups, no channels).

:class:`WorkerBase` is the part of :class:`~p2p_worker.Worker` that channel workers share
with user workers; ``Worker`` adds channels and ``create_group``. Keeping it apart lets
the group and channel modules depend on it without depending on each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, cast, overload

import torch

from p2p_asyncwork import AsyncWork
from p2p_collective import Collective, CollectiveGroup
from p2p_worker._address import WorkerAddress, member_address
from p2p_worker._errors import WorkerError
from p2p_worker._info import WorkerInfo
from p2p_worker._process._accelerator import AcceleratorAttribute
from p2p_worker._process._collectives import CollectivesMixin
from p2p_worker._process._extensions import load_user_extensions
from p2p_worker._process._options import CollectiveGroupOptions, check_options
from p2p_worker._process._timer import timed, timer
from p2p_worker._runtime._state import WorkerRuntime

Ranks = int | Sequence[int]
"""A rank in a group, or a rank path from a root group down (``(0, 1)``: child 1 of rank 0)."""


class WorkerBase(CollectivesMixin):
    """A worker process: its identity, point-to-point transfers and collectives.

    Subclass :class:`~p2p_worker.Worker`, not this class; see its documentation.
    """

    _rank: int
    _world_size: int
    timer = staticmethod(timer)
    torch_device_type = AcceleratorAttribute("device_type")
    torch_platform = AcceleratorAttribute("platform")

    def __init__(self) -> None:
        if "_p2p_runtime" not in self.__dict__:
            # Constructed directly, not launched in a group: a stand-alone worker.
            self._rank = 0
            self._world_size = 1
            self._p2p_runtime: WorkerRuntime | None = None
            self._p2p_info: WorkerInfo | None = None

    # -- identity ------------------------------------------------------------------------

    @property
    def worker_info(self) -> WorkerInfo:
        """This worker's :class:`WorkerInfo`.

        Raises:
            WorkerError: The worker was not launched in a group.
        """
        info: WorkerInfo | None = self.__dict__.get("_p2p_info")
        if info is None:
            raise self._p2p_not_launched(
                f"so it has no WorkerInfo; use {type(self).__name__}.create_group().launch(cluster)"
            )
        return info

    @property
    def worker_address(self) -> WorkerAddress:
        """This worker's :class:`WorkerAddress` (see :attr:`worker_info`)."""
        return self.worker_info.address

    @property
    def has_accelerator(self) -> bool:
        """Whether this process sees an accelerator (``torch_device_type`` is not None)."""
        return self.torch_device_type is not None

    def worker_timer(self, tag: str) -> AbstractContextManager[None]:
        """Time a block under ``tag``; the group call's handle reports it.

        Args:
            tag: Name the duration is reported under in ``consume_durations()``.

        Returns:
            A context manager.

        Raises:
            TypeError: ``tag`` is not a non-empty str.

        Example:
            >>> w = Worker()
            >>> with w.worker_timer("load"):
            ...     pass
        """
        local: dict[str, float] = self.__dict__.setdefault("_p2p_local_durations", {})
        return timed(tag, local)

    def _load_user_extensions(self) -> None:
        """Import ``$P2P_EXT_MODULE`` / ``$RLINF_EXT_MODULE`` and call its ``register()``.

        Every launched worker does this once, before its ``__init__`` (RLinf's hook of
        the same name; see :func:`~p2p_worker._process._extensions.load_user_extensions`).

        Raises:
            WorkerError: The module cannot be imported or its ``register()`` raised.
        """
        load_user_extensions()

    # -- communication -------------------------------------------------------------------

    @property
    def collective(self) -> Collective:
        """This process's ``p2p_collective.Collective``, created on first use.

        Raises:
            WorkerError: The worker was not launched in a group.
        """
        return self._p2p_worker_runtime().collective()

    def _p2p_worker_runtime(self) -> WorkerRuntime:
        """This worker's runtime, or a WorkerError saying that launching creates it."""
        runtime: WorkerRuntime | None = self.__dict__.get("_p2p_runtime")
        if runtime is None:
            raise self._p2p_not_launched("so it cannot communicate")
        return runtime

    def _p2p_not_launched(self, consequence: str) -> WorkerError:
        return WorkerError(
            f"{type(self).__name__} was not launched in a WorkerGroup, {consequence}"
        )

    def _p2p_peer_group(
        self,
        group_name: str,
        rank: int | Sequence[int],
        arg: str,
        options: CollectiveGroupOptions | None = None,
    ) -> CollectiveGroup:
        peer = member_address(group_name, rank, f"{arg}_group_name", f"{arg}_rank")
        check_options(options)
        me = self.worker_address
        if peer == me:
            raise ValueError(
                f"{arg}_group_name={group_name!r}, {arg}_rank={rank!r} is this worker "
                f"({me}); a worker cannot send to or receive from itself"
            )
        if options is not None:  # the first options between two workers count (as in RLinf)
            self.__dict__.setdefault("_p2p_options", {}).setdefault(peer.get_name(), options)
        return self.collective.create_pair_group([me, peer])

    def collective_options(
        self, group_name: str, rank: int | Sequence[int]
    ) -> CollectiveGroupOptions | None:
        """The :class:`CollectiveGroupOptions` in effect toward one peer, if any were given.

        The options of the first operation toward a peer that passed ``options=`` count;
        later ones are ignored, as in RLinf.

        Args:
            group_name: The peer's group name.
            rank: The peer's rank (or rank path).

        Returns:
            The options, or ``None`` when no operation toward that peer passed any.

        Example:
            >>> self.collective_options("learner", 0)  # doctest: +SKIP
            CollectiveGroupOptions(accel_cluster_size=None, accel_max_ctas=1, ...)
        """
        name = member_address(group_name, rank).get_name()
        found: CollectiveGroupOptions | None = self.__dict__.get("_p2p_options", {}).get(name)
        return found

    @overload
    def send(
        self,
        object: object,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: Literal[False] = ...,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> None: ...
    @overload
    def send(
        self,
        object: object,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: Literal[True],
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[None]: ...
    @overload
    def send(
        self,
        object: object,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: bool,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[None] | None: ...

    def send(
        self,
        object: object,  # the name seed 004 uses
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: bool = False,
        options: CollectiveGroupOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncWork[None] | None:
        """Send ``object`` to the worker ``dst_rank`` of group ``dst_group_name``.

        Tensors, lists/tuples of tensors, dicts of tensors and dataclasses with tensor
        fields take the optimized tensor path; any other picklable object is pickled.
        The receiver calls :meth:`recv` with this worker's group name and rank.

        Args:
            object: What to send.
            dst_group_name: Name of the receiver's group: a root group's name, or a
                child group's (its parent's address, e.g. ``"trainer:0"``).
            dst_rank: The receiver's rank (or rank path) in that group.
            async_op: Return an :class:`~p2p_asyncwork.AsyncWork` at once instead of
                waiting.
            options: RLinf's :class:`CollectiveGroupOptions` (accelerator tuning; the
                first options between two workers count).
            timeout: Seconds the send may take; ``None`` uses the job's default.

        Returns:
            ``None``, or (``async_op=True``) an ``AsyncWork[None]`` completing when the
            send is done.

        Raises:
            ValueError: The destination is this worker, or the payload is refused.
            TypeError: A name, rank or ``options`` has the wrong type.
            WorkerError: The worker was not launched in a group.
            p2p_collective.CollectiveError: The transfer failed.

        Example:
            >>> self.send({"w": torch.ones(4)}, dst_group_name="learner", dst_rank=0)  # doctest: +SKIP
        """  # noqa: E501
        group = self._p2p_peer_group(dst_group_name, dst_rank, "dst", options)
        return cast("AsyncWork[None] | None", group.send(object, async_op, timeout=timeout))

    @overload
    def recv(
        self,
        src_group_name: str,
        src_rank: Ranks,
        async_op: Literal[False] = ...,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> Any: ...
    @overload
    def recv(
        self,
        src_group_name: str,
        src_rank: Ranks,
        async_op: Literal[True],
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[Any]: ...
    @overload
    def recv(
        self,
        src_group_name: str,
        src_rank: Ranks,
        async_op: bool,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> Any: ...

    def recv(
        self,
        src_group_name: str,
        src_rank: Ranks,
        async_op: bool = False,
        options: CollectiveGroupOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Receive the next object that worker ``src_rank`` of ``src_group_name`` sent.

        Args:
            src_group_name: Name of the sender's group: a root group's name, or a
                child group's (its parent's address, e.g. ``"trainer:0"``).
            src_rank: The sender's rank (or rank path) in that group.
            async_op: Return an :class:`~p2p_asyncwork.AsyncWork` at once instead of
                waiting.
            options: RLinf's :class:`CollectiveGroupOptions` (accelerator tuning; the
                first options between two workers count).
            timeout: Seconds to wait; ``None`` uses the job's default.

        Returns:
            The object, or (``async_op=True``) an ``AsyncWork`` whose ``wait()`` returns
            it.

        Raises:
            ValueError: The source is this worker.
            TypeError: A name, rank or ``options`` has the wrong type.
            WorkerError: The worker was not launched in a group.
            p2p_collective.CollectiveError: The transfer failed or timed out.

        Example:
            >>> obj = self.recv(src_group_name="actor", src_rank=0)  # doctest: +SKIP
        """
        group = self._p2p_peer_group(src_group_name, src_rank, "src", options)
        return group.recv(async_op, timeout=timeout)

    @overload
    def send_tensor(
        self,
        tensor: torch.Tensor,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: Literal[False] = ...,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> None: ...
    @overload
    def send_tensor(
        self,
        tensor: torch.Tensor,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: Literal[True],
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[None]: ...
    @overload
    def send_tensor(
        self,
        tensor: torch.Tensor,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: bool,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[None] | None: ...

    def send_tensor(
        self,
        tensor: torch.Tensor,
        dst_group_name: str,
        dst_rank: Ranks,
        async_op: bool = False,
        options: CollectiveGroupOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncWork[None] | None:
        """Send one tensor with no metadata; the receiver must call :meth:`recv_tensor`.

        The receiver already holds a tensor of the same dtype and shape, so nothing but
        the payload travels. Never answer it with :meth:`recv`.

        Args:
            tensor: A contiguous tensor.
            dst_group_name: Name of the receiver's group: a root group's name, or a
                child group's (its parent's address, e.g. ``"trainer:0"``).
            dst_rank: The receiver's rank (or rank path) in that group.
            async_op: Return an :class:`~p2p_asyncwork.AsyncWork` at once instead of
                waiting.
            options: RLinf's :class:`CollectiveGroupOptions` (accelerator tuning; the
                first options between two workers count).
            timeout: Seconds the send may take; ``None`` uses the job's default.

        Returns:
            ``None``, or (``async_op=True``) an ``AsyncWork[None]``.

        Raises:
            ValueError: The destination is this worker, or the tensor is refused.
            TypeError: A name, rank or ``options`` has the wrong type.
            WorkerError: The worker was not launched in a group.
            p2p_collective.CollectiveError: The transfer failed.

        Example:
            >>> self.send_tensor(torch.ones(2, 1), "recv_group", 0)  # doctest: +SKIP
        """
        group = self._p2p_peer_group(dst_group_name, dst_rank, "dst", options)
        work = group.send_tensor(tensor, async_op, timeout=timeout)
        return cast("AsyncWork[None] | None", work)

    @overload
    def recv_tensor(
        self,
        tensor: torch.Tensor,
        src_group_name: str,
        src_rank: Ranks,
        async_op: Literal[False] = ...,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> torch.Tensor: ...
    @overload
    def recv_tensor(
        self,
        tensor: torch.Tensor,
        src_group_name: str,
        src_rank: Ranks,
        async_op: Literal[True],
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[torch.Tensor]: ...
    @overload
    def recv_tensor(
        self,
        tensor: torch.Tensor,
        src_group_name: str,
        src_rank: Ranks,
        async_op: bool,
        options: CollectiveGroupOptions | None = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncWork[torch.Tensor] | torch.Tensor: ...

    def recv_tensor(
        self,
        tensor: torch.Tensor,
        src_group_name: str,
        src_rank: Ranks,
        async_op: bool = False,
        options: CollectiveGroupOptions | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncWork[torch.Tensor] | torch.Tensor:
        """Receive one tensor in place, sent by the peer's :meth:`send_tensor`.

        Args:
            tensor: The buffer to fill: same dtype and shape as the sent tensor.
            src_group_name: Name of the sender's group: a root group's name, or a
                child group's (its parent's address, e.g. ``"trainer:0"``).
            src_rank: The sender's rank (or rank path) in that group.
            async_op: Return an :class:`~p2p_asyncwork.AsyncWork` at once instead of
                waiting.
            options: RLinf's :class:`CollectiveGroupOptions` (accelerator tuning; the
                first options between two workers count).
            timeout: Seconds to wait; ``None`` uses the job's default.

        Returns:
            ``tensor`` filled, or (``async_op=True``) an ``AsyncWork[torch.Tensor]`` whose
            ``wait()`` returns it.

        Raises:
            ValueError: The source is this worker.
            TypeError: A name, rank or ``options`` has the wrong type.
            WorkerError: The worker was not launched in a group.
            p2p_collective.CollectiveError: The transfer failed or timed out.

        Example:
            >>> buf = torch.empty(2, 1)  # doctest: +SKIP
            >>> self.recv_tensor(buf, "send_group", 0)  # doctest: +SKIP
        """
        group = self._p2p_peer_group(src_group_name, src_rank, "src", options)
        work = group.recv_tensor(tensor, async_op, timeout=timeout)
        return cast("AsyncWork[torch.Tensor] | torch.Tensor", work)
