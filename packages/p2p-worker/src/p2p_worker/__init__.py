"""Workers, worker groups, addresses and timers on Ray: the top layer of the p2p stack.

A :class:`Cluster` attaches to (or starts) a Ray cluster and validates the job's
configuration; subclassing :class:`Worker` gives a Ray actor that knows its
:class:`WorkerInfo` and talks to any other worker by group name and rank;
:class:`WorkerGroup` launches a group of them and calls them all at once.

Example:
    >>> from p2p_worker import Cluster, PackedPlacementStrategy, Worker
    >>> class Echo(Worker):
    ...     def echo(self, x):
    ...         return (self._rank, x)
    >>> with Cluster(num_nodes=1) as cluster:  # doctest: +SKIP
    ...     group = Echo.create_group().launch(
    ...         cluster, PackedPlacementStrategy(2), name="echo"
    ...     )
    ...     group.echo("hi").wait()
    [(0, 'hi'), (1, 'hi')]
"""

from p2p_worker._address import WorkerAddress
from p2p_worker._channels import (
    Channel,
    ChannelClosedError,
    ChannelEmpty,
    ChannelError,
    ChannelExistsError,
    ChannelFull,
    ChannelNotFoundError,
    ChannelWork,
    ChannelWorker,
    LocalChannel,
    connect_channel,
    create_channel,
)
from p2p_worker._config import ClusterConfig, parse_cluster_config
from p2p_worker._errors import ClusterError, PlacementError, WorkerError
from p2p_worker._groups._group import WorkerGroup
from p2p_worker._groups._handle import GroupCallHandle
from p2p_worker._groups._members import WorkerRank
from p2p_worker._groups._packed import PackedPlacementStrategy
from p2p_worker._info import NodeInfo, WorkerInfo
from p2p_worker._job._cluster import Cluster
from p2p_worker._job._placement import (
    CountPlacementStrategy,
    NodePlacementStrategy,
    PlacementStrategy,
    WorkerPlacement,
)
from p2p_worker._managers._collective import CollectiveGroupInfo, CollectiveManager
from p2p_worker._managers._manager import Manager, ManagerProxy
from p2p_worker._process._options import CollectiveGroupOptions
from p2p_worker._weights._errors import WeightSyncError
from p2p_worker._weights._report import PushReport
from p2p_worker._weights._source import WeightSender
from p2p_worker._weights._target import WeightReceiver
from p2p_worker._workers._worker import Worker

__version__ = "0.1.0"

WorkerGroupFuncResult = GroupCallHandle
"""RLinf's name for the handle a group call returns (:class:`GroupCallHandle`)."""

__all__ = [
    "Cluster",
    "ClusterConfig",
    "parse_cluster_config",
    "PlacementStrategy",
    "PackedPlacementStrategy",
    "CountPlacementStrategy",
    "NodePlacementStrategy",
    "WorkerPlacement",
    "NodeInfo",
    "Worker",
    "WorkerGroup",
    "GroupCallHandle",
    "WorkerGroupFuncResult",
    "WorkerRank",
    "CollectiveGroupOptions",
    "WorkerAddress",
    "WorkerInfo",
    "WorkerError",
    "ClusterError",
    "PlacementError",
    "Channel",
    "ChannelWork",
    "ChannelWorker",
    "LocalChannel",
    "create_channel",
    "connect_channel",
    "ChannelError",
    "ChannelFull",
    "ChannelEmpty",
    "ChannelNotFoundError",
    "ChannelExistsError",
    "ChannelClosedError",
    "Manager",
    "ManagerProxy",
    "CollectiveManager",
    "CollectiveGroupInfo",
    "WeightSender",
    "WeightReceiver",
    "PushReport",
    "WeightSyncError",
    "__version__",
]
