"""A drop-in for ``ray.util.collective``: the same calls, from any Ray actor or task.

Code written for Ray's collective library runs with only the import changed::

    import p2p_worker.compat as col   # instead of: import ray.util.collective as col
    from p2p_worker.compat.types import ReduceOp   # ray.util.collective.types

Groups are initialized in each member (:func:`init_collective_group`) or declared from
the driver over actor handles (:func:`create_collective_group`); the members of a plain
``@ray.remote`` actor group meet through a rendezvous that Ray itself finds (one named
actor per job, see :doc:`/concepts/ray-collective`), the members of p2p ``Worker`` s
through the job's store. Operations run on p2p-collective: gloo for the collectives,
shared memory for ``send``/``recv`` between members on one node.

Beyond Ray: every operation takes ``timeout=`` (seconds); a member that dies fails the
others' pending operations with ``p2p_collective.PeerError`` within seconds; a group
of one works; :func:`get_group_handle` gives the p2p groups for asynchronous calls.
Errors keep the builtin bases Ray's callers catch (``RuntimeError``, ``ValueError``).

Example:
    >>> import ray  # doctest: +SKIP
    >>> import p2p_worker.compat as col  # doctest: +SKIP
    >>> @ray.remote
    ... class Member:
    ...     def setup(self, world_size, rank):
    ...         col.init_collective_group(world_size, rank, "gloo", "default")
    ...     def step(self):
    ...         grad = torch.ones(4)
    ...         col.allreduce(grad, "default")
    ...         return grad  # doctest: +SKIP
"""

from __future__ import annotations

from p2p_worker._raycoll._errors import (
    BackendUnavailableError,
    CollectiveArgumentError,
    GroupExistsError,
    GroupNotInitializedError,
    GroupSpecError,
    RayCollectiveError,
    ReadOnlyArrayWarning,
    TensorTypeError,
)
from p2p_worker._raycoll._group import GroupHandle
from p2p_worker._raycoll._manage import (
    create_collective_group,
    destroy_collective_group,
    get_collective_group_size,
    get_group_handle,
    get_rank,
    gloo_available,
    init_collective_group,
    is_backend_available,
    is_group_initialized,
    nccl_available,
    register_collective_backend,
)
from p2p_worker._raycoll._multigpu import (
    allgather_multigpu,
    allreduce_multigpu,
    broadcast_multigpu,
    recv_multigpu,
    reduce_multigpu,
    reducescatter_multigpu,
    send_multigpu,
    synchronize,
)
from p2p_worker._raycoll._ops import (
    allgather,
    allreduce,
    barrier,
    broadcast,
    recv,
    reduce,
    reduce_scatter,
    reducescatter,
    send,
)
from p2p_worker._raycoll._types import Backend, ReduceOp
from p2p_worker.compat import types

__all__ = [
    "types",
    "ReduceOp",
    "Backend",
    "GroupHandle",
    "nccl_available",
    "gloo_available",
    "is_backend_available",
    "register_collective_backend",
    "init_collective_group",
    "create_collective_group",
    "destroy_collective_group",
    "is_group_initialized",
    "get_rank",
    "get_collective_group_size",
    "get_group_handle",
    "allreduce",
    "barrier",
    "reduce",
    "broadcast",
    "allgather",
    "reducescatter",
    "reduce_scatter",
    "send",
    "recv",
    "allreduce_multigpu",
    "reduce_multigpu",
    "broadcast_multigpu",
    "allgather_multigpu",
    "reducescatter_multigpu",
    "send_multigpu",
    "recv_multigpu",
    "synchronize",
    "RayCollectiveError",
    "GroupNotInitializedError",
    "GroupExistsError",
    "CollectiveArgumentError",
    "GroupSpecError",
    "TensorTypeError",
    "BackendUnavailableError",
    "ReadOnlyArrayWarning",
]
