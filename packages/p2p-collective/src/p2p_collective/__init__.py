"""Ordered, framed, asynchronous two-party send/recv over torch.distributed.

A :class:`Collective` (one per process) creates and caches :class:`CollectiveGroup` s,
each an ordered channel between this process and one peer, found through a rendezvous
store such as ``torch.distributed.TCPStore``. No Ray is needed.

Example:
    >>> import datetime, torch, torch.distributed as dist  # doctest: +SKIP
    >>> from p2p_collective import Collective  # doctest: +SKIP
    >>> store = dist.TCPStore("127.0.0.1", 29500, is_master=True,  # doctest: +SKIP
    ...                       timeout=datetime.timedelta(seconds=60))
    >>> group = Collective("a", store).create_collective_group(["a", "b"])  # doctest: +SKIP
    >>> group.send({"x": torch.ones(3)})  # the peer "b" calls group.recv()  # doctest: +SKIP
"""

from p2p_collective._compression import CompressionPipelineConfig
from p2p_collective._config import (
    DEFAULT_INIT_TIMEOUT,
    DEFAULT_OP_TIMEOUT,
    CollectiveConfig,
    NetEmulationConfig,
    parse_collective_config,
    parse_net_emulation,
)
from p2p_collective._errors import (
    AuthenticationError,
    CollectiveError,
    CollectiveTimeoutError,
    FramingError,
    GroupBrokenError,
    GroupClosedError,
    ObjectRefusedError,
    PeerError,
    PeerGoneError,
)
from p2p_collective._frames._framing import HEADER_MAX
from p2p_collective._groups._arrays import as_tensor
from p2p_collective._groups._collective import Collective
from p2p_collective._groups._group import CollectiveGroup
from p2p_collective._groups._group_ops import Unready
from p2p_collective._groups._multi import MultiCollectiveGroup
from p2p_collective._groups._multi_channel import MultiChannelProcessGroup
from p2p_collective._groups._multi_create import create_multi_group, join_ranked_group
from p2p_collective._links._emulation import EMULATED_WINDOW_BYTES, LinkEmulation
from p2p_collective._peers._rendezvous import Store

__version__ = "0.1.0"

__all__ = [
    "Collective",
    "CollectiveGroup",
    "Unready",
    "MultiCollectiveGroup",
    "MultiChannelProcessGroup",
    "create_multi_group",
    "join_ranked_group",
    "as_tensor",
    "Store",
    "CollectiveConfig",
    "NetEmulationConfig",
    "CompressionPipelineConfig",
    "LinkEmulation",
    "EMULATED_WINDOW_BYTES",
    "parse_collective_config",
    "parse_net_emulation",
    "DEFAULT_INIT_TIMEOUT",
    "DEFAULT_OP_TIMEOUT",
    "HEADER_MAX",
    "CollectiveError",
    "CollectiveTimeoutError",
    "FramingError",
    "PeerError",
    "PeerGoneError",
    "GroupBrokenError",
    "GroupClosedError",
    "ObjectRefusedError",
    "AuthenticationError",
    "__version__",
]
