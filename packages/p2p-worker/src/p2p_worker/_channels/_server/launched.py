"""A channel worker launched as a worker group (RLinf's ``ChannelWorker.create_group``).

Such a worker takes its channel's name from its group and its job from the runtime the
group gave it; peers find it as the group's rank 0 (see ``connect.lookup_actor``).
"""

from __future__ import annotations

import uuid

from p2p_worker._channels._protocol.proto import DEFAULT_TRANSFER_TIMEOUT, ChannelSpec
from p2p_worker._errors import WorkerError
from p2p_worker._process._worker_base import WorkerBase


def launched_spec(worker: WorkerBase, maxsize: object) -> ChannelSpec:
    """The spec of channel worker ``worker``, launched in a group with ``maxsize``.

    Raises:
        TypeError: ``maxsize`` is not an int.
        ValueError: ``maxsize`` < 0, or the group has more than one worker.
        WorkerError: ``worker`` was not launched in a group.
    """
    if isinstance(maxsize, bool) or not isinstance(maxsize, int):
        raise TypeError(f"maxsize must be an int, got {maxsize!r}")
    if maxsize < 0:
        raise ValueError(f"maxsize must be >= 0 (0: no bound), got {maxsize}")
    runtime = worker.__dict__.get("_p2p_runtime")
    if runtime is None:
        raise WorkerError(
            "a ChannelWorker runs in a launched group: ChannelWorker.create_group(maxsize=...)"
            ".launch(cluster, NodePlacementStrategy([node]), name=channel_name); or use "
            "Channel.create(channel_name)"
        )
    if worker._world_size != 1:
        raise ValueError(
            f"a ChannelWorker group of {worker._world_size} workers: a channel spread over "
            f"several channel workers (RLinf's distributed channel) is not supported; launch "
            f"one, e.g. with NodePlacementStrategy([node_rank])"
        )
    info = worker.worker_info
    return ChannelSpec(
        info.address.root_group_name,
        uuid.uuid4().hex[:12],
        maxsize,
        runtime.job,
        info.node_id,
        DEFAULT_TRANSFER_TIMEOUT,
    )
