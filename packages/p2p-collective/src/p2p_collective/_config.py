"""Configuration of the collective layer, parsed from the job's plain-dict config tree.

``cluster.collective`` holds the compression and buffer-pool sections of seed 000 (parsed
by p2p-compress) and this layer's timeouts; ``cluster.net_emulation`` is a sibling
section parsed by :func:`parse_net_emulation`. Errors are
:class:`p2p_asyncwork.ConfigError` naming the key path, the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from p2p_collective._compression._settings import (
    CompressionPipelineConfig,
    parse_compression_pipeline,
)
from p2p_collective._frames._plain import parse_allowlist_entry
from p2p_collective._links._emulation import NetEmulationConfig as NetEmulationConfig
from p2p_collective._links._emulation import parse_net_emulation as parse_net_emulation
from p2p_collective._validate import fail as _fail
from p2p_collective._validate import mapping as _plain_mapping
from p2p_compress import (
    TensorBufferPoolConfig,
    TensorCompressionConfig,
    parse_tensor_buffer_pool,
    parse_tensor_compression,
)

DEFAULT_INIT_TIMEOUT = 60.0
"""Seconds the first operation of a direction waits for the peer to join it."""
DEFAULT_OP_TIMEOUT = 1800.0
"""Seconds an operation may take, queueing included, when the call passes no timeout."""
DEFAULT_RECV_BUFFER_CACHE_BYTES = 1 << 30
"""Idle bytes of large receive buffers a process keeps for reuse."""
OBJECT_POLICIES = ("pickle", "plain")
"""Values of ``object_policy``: what a receiver accepts in a frame's object part."""


def _mapping(section: object, path: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    return _plain_mapping(section, path, keys, "a mapping of keys to values (or omit the section)")


def _timeout(value: object, path: str) -> float | None:
    # Infinity is refused, not read as "no limit": null is the one spelling of that, and an
    # infinite float cannot reach torch's timedelta-based timeouts.
    allowed = "a finite number of seconds > 0, or null for no limit"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, value, allowed)
    if not math.isfinite(value) or not value > 0:
        raise _fail(path, value, allowed)
    return float(value)


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, value, "true or false")
    return value


def _policy(value: object, path: str) -> str:
    if value not in OBJECT_POLICIES:
        allowed = " or ".join(repr(p) for p in OBJECT_POLICIES)
        raise _fail(path, value, allowed, choices=OBJECT_POLICIES)
    return str(value)


def _allowlist(value: object, path: str) -> tuple[str, ...]:
    allowed = "a list of 'package.module:ClassName' strings naming dataclasses"
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _fail(path, value, allowed)
    out: list[str] = []
    for i, entry in enumerate(value):
        try:
            parse_allowlist_entry(entry)
        except ValueError:
            raise _fail(
                f"{path}[{i}]", entry, "a 'package.module:ClassName' string naming a dataclass"
            ) from None
        out.append(entry)
    return tuple(out)


def _allowlist_needs_plain(policy: str, allowlist: tuple[str, ...], path: str) -> None:
    if allowlist and policy != "plain":
        raise _fail(
            path,
            list(allowlist),
            "an empty list unless object_policy is 'plain'",
            f"object_policy {policy!r} accepts every object, so an allowlist restricts nothing",
        )


def _nonneg_int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(path, value, "an integer >= 0")
    return int(value)


@dataclass(frozen=True)
class CollectiveConfig:
    """Job-level configuration of every :class:`~p2p_collective.Collective` of a job.

    Attributes:
        compression: Tensor compression on the wire, or None for raw.
        buffer_pool: Bound on the pooled compression buffers of one process.
        compression_pipeline: Threads and overlap of the codec work (used only with
            ``compression``).
        net_emulation: Link emulation, paced at each sender, or None.
        init_timeout: Seconds the first operation of each direction waits for the peer
            to join that direction (None: no limit). Default 60.
        op_timeout: Seconds an operation may take from submission to completion when
            the call passes ``timeout=None`` (None: no limit). Default 1800.
        recv_buffer_cache_bytes: Idle bytes of large (>= 1 MiB) receive buffers kept
            for reuse once the received tensors are garbage; 0 disables. Default 1 GiB.
        shared_memory: Move CPU tensor payloads through shared memory when both members
            of a group are on the same node (falls back to gloo otherwise, saying why in
            the group's stats). Default true.
        object_policy: What a receiver accepts in a frame's object part: ``"pickle"``
            (any picklable object; a peer can run code in this process, so every peer
            must be trusted) or ``"plain"`` (tensor containers and plain data only;
            anything else is refused with ``ObjectRefusedError``). Default ``"pickle"``.
        object_allowlist: Dataclasses ``"plain"`` also accepts, as
            ``"package.module:ClassName"`` strings (their ``__init__``/``__setstate__``
            may run on receipt). Only with ``object_policy="plain"``. Default empty.

    Example:
        >>> CollectiveConfig().op_timeout
        1800.0
    """

    compression: TensorCompressionConfig | None = None
    buffer_pool: TensorBufferPoolConfig = field(default_factory=TensorBufferPoolConfig)
    compression_pipeline: CompressionPipelineConfig = field(
        default_factory=CompressionPipelineConfig
    )
    net_emulation: NetEmulationConfig | None = None
    init_timeout: float | None = DEFAULT_INIT_TIMEOUT
    op_timeout: float | None = DEFAULT_OP_TIMEOUT
    recv_buffer_cache_bytes: int = DEFAULT_RECV_BUFFER_CACHE_BYTES
    shared_memory: bool = True
    object_policy: str = "pickle"
    object_allowlist: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.compression_pipeline, CompressionPipelineConfig):
            raise _fail(
                "compression_pipeline", self.compression_pipeline, "a CompressionPipelineConfig"
            )
        _timeout(self.init_timeout, "init_timeout")
        _timeout(self.op_timeout, "op_timeout")
        _nonneg_int(self.recv_buffer_cache_bytes, "recv_buffer_cache_bytes")
        _bool(self.shared_memory, "shared_memory")
        _policy(self.object_policy, "object_policy")
        object.__setattr__(
            self, "object_allowlist", _allowlist(self.object_allowlist, "object_allowlist")
        )
        _allowlist_needs_plain(self.object_policy, self.object_allowlist, "object_allowlist")

    def to_dict(self) -> dict[str, object]:
        """The ``cluster.collective`` section as a plain dict (net_emulation is separate)."""
        out: dict[str, object] = {
            "tensor_buffer_pool": self.buffer_pool.to_dict(),
            "compression_pipeline": self.compression_pipeline.to_dict(),
            "init_timeout": self.init_timeout,
            "op_timeout": self.op_timeout,
            "recv_buffer_cache_bytes": self.recv_buffer_cache_bytes,
            "shared_memory": self.shared_memory,
            "object_policy": self.object_policy,
            "object_allowlist": list(self.object_allowlist),
        }
        if self.compression is not None:
            out["tensor_compression"] = self.compression.to_dict()
        return out


def parse_collective_config(
    section: Mapping[str, Any] | None, path: str = "cluster.collective"
) -> CollectiveConfig:
    """Parse the ``cluster.collective`` section.

    Keys: ``tensor_compression`` and ``tensor_buffer_pool`` (seed 000, parsed by
    p2p-compress), ``compression_pipeline`` (``overlap``, ``compressor_threads``,
    ``decoder_threads``: how codec work is scheduled), ``init_timeout`` and
    ``op_timeout`` (seconds or null),
    ``recv_buffer_cache_bytes`` (integer >= 0), ``shared_memory`` (true/false),
    ``object_policy`` (``pickle`` or ``plain``) and ``object_allowlist`` (a list of
    ``"package.module:ClassName"`` dataclasses that ``plain`` also accepts).
    ``net_emulation`` lives at ``cluster.net_emulation``; attach it with
    ``dataclasses.replace(config, net_emulation=parse_net_emulation(...))``.

    Args:
        section: The section as a plain dict, or None for all defaults.
        path: The section's key path, for error messages.

    Returns:
        The frozen config.

    Raises:
        ConfigError: An unknown key or a bad value, anywhere in the section.

    Example:
        >>> cfg = parse_collective_config({"tensor_compression": {"codec": "lz4"}})
        >>> cfg.compression.codec_name, cfg.buffer_pool.max_bytes
        ('lz4', 2147483648)
    """
    if section is None:
        return CollectiveConfig()
    keys = (
        "tensor_compression",
        "tensor_buffer_pool",
        "compression_pipeline",
        "init_timeout",
        "op_timeout",
        "recv_buffer_cache_bytes",
        "shared_memory",
        "object_policy",
        "object_allowlist",
    )
    sec = _mapping(section, path, keys)
    policy = _policy(sec.get("object_policy", "pickle"), f"{path}.object_policy")
    allowlist = _allowlist(sec.get("object_allowlist", []), f"{path}.object_allowlist")
    _allowlist_needs_plain(policy, allowlist, f"{path}.object_allowlist")
    return CollectiveConfig(
        compression=parse_tensor_compression(
            sec.get("tensor_compression"), f"{path}.tensor_compression"
        ),
        buffer_pool=parse_tensor_buffer_pool(
            sec.get("tensor_buffer_pool"), f"{path}.tensor_buffer_pool"
        ),
        compression_pipeline=parse_compression_pipeline(
            sec.get("compression_pipeline"), f"{path}.compression_pipeline"
        ),
        init_timeout=_timeout(
            sec.get("init_timeout", DEFAULT_INIT_TIMEOUT), f"{path}.init_timeout"
        ),
        op_timeout=_timeout(sec.get("op_timeout", DEFAULT_OP_TIMEOUT), f"{path}.op_timeout"),
        recv_buffer_cache_bytes=_nonneg_int(
            sec.get("recv_buffer_cache_bytes", DEFAULT_RECV_BUFFER_CACHE_BYTES),
            f"{path}.recv_buffer_cache_bytes",
        ),
        shared_memory=_bool(sec.get("shared_memory", True), f"{path}.shared_memory"),
        object_policy=policy,
        object_allowlist=allowlist,
    )
