"""The Worker base class: subclass it to get a Ray actor that knows its place in the job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from p2p_worker._channel import ChannelMixin
from p2p_worker._worker_base import WorkerBase

if TYPE_CHECKING:
    from p2p_worker._group import WorkerGroup

W = TypeVar("W", bound="Worker")


class Worker(ChannelMixin, WorkerBase):
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
    def create_group(cls: type[W], *args: Any, **kwargs: Any) -> WorkerGroup[W]:
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
        from p2p_worker._group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)
