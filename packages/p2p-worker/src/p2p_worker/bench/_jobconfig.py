"""The job configuration of one p2p block of the benchmark: codec section and link emulation."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from p2p_worker.bench._spec import LinkProfile


class CompressionSection(TypedDict):
    """``cluster.collective.tensor_compression``: the codec and its settings."""

    enabled: bool
    codec: str
    min_bytes: int
    excluded_dtypes: list[str]
    acceleration: NotRequired[int]
    level: NotRequired[int]
    max_inflight: NotRequired[int]


class PipelineSection(TypedDict, total=False):
    """``cluster.collective.compression_pipeline``: chunking, and the adaptive choice."""

    chunk_bytes: int
    adaptive: bool | dict[str, list[str]]


class CollectiveSection(TypedDict):
    """``cluster.collective``."""

    init_timeout: float
    tensor_compression: NotRequired[CompressionSection]
    compression_pipeline: NotRequired[PipelineSection]


class NetEmulationSection(TypedDict, total=False):
    """``cluster.net_emulation``: the emulated link."""

    enabled: bool
    bandwidth_mbps: float
    delay_ms: float
    egress: str


class ClusterSection(TypedDict):
    """``cluster``."""

    collective: CollectiveSection
    net_emulation: NotRequired[NetEmulationSection]


class JobConfig(TypedDict):
    """A benchmark job's configuration: ``{"cluster": {...}}``."""

    cluster: ClusterSection


COMPRESSION_SECTIONS: dict[str, CompressionSection] = {
    "lz4": {
        "enabled": True,
        "codec": "lz4",
        "min_bytes": 16384,
        "excluded_dtypes": [],
        "acceleration": 1,
    },
    "zstd": {
        "enabled": True,
        "codec": "zstd",
        "min_bytes": 16384,
        "excluded_dtypes": [],
        "level": 1,
        "max_inflight": 4,
    },
}
"""``tensor_compression`` per codec. ``excluded_dtypes: []`` lets the float32 fields of the
tensor_dict and dataclass payloads take part (the default ``[float32]`` would skip them)."""
COMPRESSION_SECTIONS["lz4_whole"] = COMPRESSION_SECTIONS["lz4"]
COMPRESSION_SECTIONS["zstd_whole"] = COMPRESSION_SECTIONS["zstd"]
COMPRESSION_SECTIONS["lz4_auto"] = COMPRESSION_SECTIONS["lz4"]
COMPRESSION_SECTIONS["zstd_auto"] = COMPRESSION_SECTIONS["zstd"]
COMPRESSION_SECTIONS["auto"] = COMPRESSION_SECTIONS["zstd"]


def net_emulation_section(link: LinkProfile) -> NetEmulationSection | None:
    """The ``cluster.net_emulation`` section of a link profile (``None`` for loopback)."""
    if link.bandwidth_bps is None:
        return None
    return {
        "enabled": True,
        "bandwidth_mbps": link.bandwidth_bps / 1e6,
        "delay_ms": link.latency_s * 1e3,
    }


def job_config(codec: str, link: LinkProfile) -> JobConfig:
    """The job configuration (``{"cluster": {...}}``) of one p2p block."""
    cluster: ClusterSection = {"collective": {"init_timeout": 120.0}}
    if codec != "raw":
        cluster["collective"]["tensor_compression"] = COMPRESSION_SECTIONS[codec].copy()
        if codec.endswith("_whole"):  # the per-tensor design: no chunked frames
            cluster["collective"]["compression_pipeline"] = {"chunk_bytes": 0}
        if codec == "auto":  # raw, lz4, zstd or sparse per link, whichever is fastest
            cluster["collective"]["compression_pipeline"] = {"adaptive": True}
        elif codec.endswith("_auto"):  # raw or this one codec per link
            only: dict[str, list[str]] = {"codecs": [codec.split("_")[0]]}
            cluster["collective"]["compression_pipeline"] = {"adaptive": only}
    net = net_emulation_section(link)
    if net is not None:
        cluster["net_emulation"] = net
    return {"cluster": cluster}
