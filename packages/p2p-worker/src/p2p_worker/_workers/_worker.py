"""The Worker base class: subclass it to get a Ray actor that knows its place in the job."""

from __future__ import annotations

from typing import TypeVar

from p2p_worker._channels.handle import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TRANSFER_TIMEOUT,
    Channel,
)
from p2p_worker._channels.service import ChannelService
from p2p_worker._groups._group import WorkerGroup
from p2p_worker._process._worker_base import WorkerBase
from p2p_worker._weights._api import WeightSyncMixin

W = TypeVar("W", bound="Worker")


class Worker(WeightSyncMixin, WorkerBase):
    """Base class of a remote worker: one Ray actor process of a :class:`WorkerGroup`.

    Subclass it, then launch a group with ``MyWorker.create_group(...).launch(cluster)``.
    Before the subclass's ``__init__`` runs, each worker already has:

    - ``MASTER_ADDR``, ``MASTER_PORT`` (a free port on rank 0's node), ``RANK``,
      ``LOCAL_RANK``, ``WORLD_SIZE`` (plus ``LOCAL_WORLD_SIZE`` and ``NODE_RANK``) in
      ``os.environ``, so ``torch.distributed.init_process_group()`` works with its
      defaults inside the worker;
    - ``self._rank``, ``self._world_size``, :attr:`worker_info` and
      :attr:`worker_address`;
    - a checked compression codec library, when the job configures compression.

    A worker talks to any other worker of the job by group name and rank:
    :meth:`send` / :meth:`recv` move any picklable object (tensors, lists and dicts of
    tensors on the optimized path) and :meth:`send_tensor` / :meth:`recv_tensor` move
    one tensor into a buffer the receiver already holds. Messages between two workers
    arrive in the order they were sent. The work is done by the process's single
    ``p2p_collective.Collective``, created on first use.

    Methods run one at a time, in call order (Ray runs them in a dedicated thread, so a
    method that blocks does not stop the group from being shut down). A class with an
    ``async def`` method becomes an asyncio actor, as in Ray and RLinf: its coroutine
    methods are awaited on the actor's event loop (``asyncio.create_task`` works there)
    and its plain methods run on that loop too.

    :attr:`torch_device_type` (``"cuda"`` or ``None``) and :attr:`torch_platform`
    (``torch.cuda`` or ``None``) tell which accelerator this process sees; like RLinf's,
    they can be read on the class (``Worker.torch_platform.set_device(...)``).

    Example:
        >>> import os
        >>> from p2p_worker import Cluster, PackedPlacementStrategy, Worker
        >>> class Hello(Worker):
        ...     def __init__(self, greeting):
        ...         super().__init__()
        ...         self.greeting = greeting
        ...     def hello(self):
        ...         return f"{self.greeting} from rank {self._rank} of {os.environ['WORLD_SIZE']}"
        >>> cluster = Cluster(num_nodes=1)  # doctest: +SKIP
        >>> group = Hello.create_group("hi").launch(
        ...     cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="hello"
        ... )  # doctest: +SKIP
        >>> group.hello().wait()  # doctest: +SKIP
        ['hi from rank 0 of 2', 'hi from rank 1 of 2']
    """

    @classmethod
    def create_group(cls: type[W], *args: object, **kwargs: object) -> WorkerGroup[W]:
        """Describe a group of this worker class; ``launch`` it to start the workers.

        Args:
            *args: Positional arguments for every worker's ``__init__``.
            **kwargs: Keyword arguments for every worker's ``__init__``.

        Returns:
            An unlaunched :class:`WorkerGroup`.

        Example:
            >>> group = Worker.create_group()
            >>> group.launched
            False
        """
        return WorkerGroup(cls, args, kwargs)

    def _channel_service(self) -> ChannelService:
        """The service that creates and connects this worker's channels."""
        return ChannelService(self.__dict__.get("_p2p_runtime"), type(self).__name__)

    def create_channel(
        self,
        channel_name: str | None = None,
        maxsize: int = 0,
        distributed: bool = False,
        node_rank: int | None = None,
        local: bool = False,
        *,
        name: str | None = None,
        node_id: int | None = None,
        transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel:
        """Create a channel named ``channel_name``, held by a channel worker on ``node_rank``.

        RLinf's signature; p2p-worker's ``name=`` / ``node_id=`` keywords still work.
        The channel outlives this worker: it lives until it is destroyed
        (:meth:`Channel.destroy`) or the job ends. Any worker (or the driver) connects
        to it by name. Unlike RLinf, a name already in use raises
        :class:`ChannelExistsError` instead of connecting.

        Args:
            channel_name: Channel name, unique in the job (letters, digits, ``_ . -``).
            maxsize: Most items the channel holds at once, over all keys, payloads in
                transit included (0: no bound).
            distributed: RLinf's one-worker-per-node channel; accepted on one node only.
            node_rank: Node (``NodeInfo.node_rank``) whose channel worker holds the
                items (default 0).
            local: RLinf's in-process channel; not supported (must be False).
            name: p2p-worker's name for ``channel_name``.
            node_id: p2p-worker's name for ``node_rank``.
            transfer_timeout: Seconds one payload transfer may take (None: no limit).
            timeout: Seconds to wait for the channel worker to start and connect.

        Returns:
            This worker's :class:`Channel` handle.

        Raises:
            TypeError: An argument has the wrong type.
            ValueError: ``name`` is invalid, ``node_id`` out of range, ``maxsize`` < 0.
            ChannelExistsError: A channel of that name exists in the job.
            ChannelError: The channel worker could not be reached.
            WorkerError: This worker was not launched in a group.

        Example:
            >>> self.channel = self.create_channel("rollouts", maxsize=4, node_rank=0)  # doctest: +SKIP
        """  # noqa: E501
        return self._channel_service().create(
            channel_name,
            maxsize,
            distributed,
            node_rank,
            local,
            name=name,
            node_id=node_id,
            transfer_timeout=transfer_timeout,
            timeout=timeout,
        )

    def connect_channel(
        self,
        channel_name: str | None = None,
        *,
        name: str | None = None,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel:
        """Connect to the existing channel ``channel_name`` (created by any worker or the driver).

        Args:
            channel_name: The channel's name (RLinf's argument name).
            name: p2p-worker's name for ``channel_name``.
            timeout: Seconds to wait for the channel to exist and answer.

        Returns:
            This worker's :class:`Channel` handle (the same object on every call).

        Raises:
            ChannelNotFoundError: No channel of that name appeared within ``timeout``.
            ChannelError: The channel worker could not be reached.
            WorkerError: This worker was not launched in a group.

        Example:
            >>> channel = self.connect_channel("rollouts")  # doctest: +SKIP
            >>> channel.put({"obs": torch.zeros(4)})  # doctest: +SKIP
        """
        return self._channel_service().connect(channel_name, name=name, timeout=timeout)
