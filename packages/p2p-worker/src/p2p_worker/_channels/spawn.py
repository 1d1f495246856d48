"""Starting a channel's worker, and the argument names (RLinf's and ours) that choose it."""

from __future__ import annotations

import threading
import uuid
from typing import cast

import ray
from ray.actor import ActorClass, ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from p2p_asyncwork.internal import check_timeout
from p2p_worker._channels._protocol.errors import ChannelExistsError
from p2p_worker._channels._protocol.proto import (
    CHANNEL_NAMESPACE,
    ChannelSpec,
    actor_name,
    check_channel_name,
)
from p2p_worker._channels._server.server import ChannelWorker
from p2p_worker._runtime._state import WorkerRuntime

MAX_CONCURRENCY = 10_000  # waiting puts and gets a channel worker serves at once

_lock = threading.Lock()
_actor_cls: ActorClass[ChannelWorker] | None = None


# -- creating and connecting --------------------------------------------------------------------


def _check_int(value: object, arg: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{arg} must be >= {low}, got {value}")
    return value


def spawn_channel_worker(
    endpoint: WorkerRuntime,
    name: str,
    node_id: int,
    maxsize: int,
    transfer_timeout: float | None,
) -> ActorHandle[ChannelWorker]:
    """Start the channel worker (a detached Ray actor) of a new channel; return its handle.

    Raises:
        TypeError, ValueError: A bad name, node, bound or timeout.
        ChannelExistsError: The job has a channel of that name.
    """
    global _actor_cls
    check_channel_name(name)
    nodes = endpoint.job.nodes
    _check_int(node_id, "node_id", 0)
    if node_id >= len(nodes):
        raise ValueError(
            f"node_id={node_id} is out of range: the cluster has {len(nodes)} node(s) "
            f"(node ids 0..{len(nodes) - 1})"
        )
    _check_int(maxsize, "maxsize", 0)
    transfer_timeout = check_timeout(transfer_timeout, "transfer_timeout")
    job = endpoint.job
    spec = ChannelSpec(name, uuid.uuid4().hex[:12], maxsize, job, node_id, transfer_timeout)
    with _lock:
        if _actor_cls is None:
            _actor_cls = ray.remote(ChannelWorker)
        actor_cls = _actor_cls
    try:
        launched = actor_cls.options(
            name=actor_name(job.store_host, job.store_port, name),
            namespace=CHANNEL_NAMESPACE,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=MAX_CONCURRENCY,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                nodes[node_id].ray_node_id, soft=False
            ),
        ).remote(spec)
    except ValueError as exc:  # ray.exceptions.ActorAlreadyExistsError
        raise ChannelExistsError(
            f"a channel named {name!r} already exists in this job; connect to it with "
            f"connect_channel({name!r}) or pick another name"
        ) from exc
    return cast("ActorHandle[ChannelWorker]", launched)  # Ray's options() loses the type


def resolve_names(
    channel_name: str | None,
    name: str | None,
    node_rank: int | None,
    node_id: int | None,
    distributed: bool = False,
    local: bool = False,
    num_nodes: int = 1,
) -> tuple[str, int]:
    """Merge RLinf's argument names with p2p-worker's: ``(name, node)`` of a new channel.

    Raises:
        TypeError: No name given, or ``distributed`` / ``local`` not a bool.
        ValueError: Both spellings of one argument given, ``local=True``, or
            ``distributed=True`` on a cluster of more than one node.
    """
    if channel_name is not None and name is not None:
        raise ValueError("give channel_name or name, not both")
    chosen = channel_name if channel_name is not None else name
    if chosen is None:
        raise TypeError("a channel name is required: channel_name=... (or name=...)")
    if node_rank is not None and node_id is not None and node_rank != node_id:
        raise ValueError(f"node_rank={node_rank} and node_id={node_id} disagree; give one")
    node = node_rank if node_rank is not None else (node_id if node_id is not None else 0)
    for flag, value in (("distributed", distributed), ("local", local)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    if local:
        raise ValueError(
            "local=True: a worker's channels live in channel workers; for an in-process "
            "channel use Channel.create(name, local=True) or LocalChannel(maxsize)"
        )
    if distributed and num_nodes > 1:
        raise ValueError(
            f"distributed=True on a {num_nodes}-node cluster: one channel worker per node is "
            f"not supported; the channel lives on node_rank={node}"
        )
    return chosen, node
