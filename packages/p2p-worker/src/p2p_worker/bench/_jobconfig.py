"""The job configuration of one p2p block of the benchmark: codec section and link emulation."""

from __future__ import annotations

from typing import Any

from p2p_worker.bench._spec import LinkProfile

COMPRESSION_SECTIONS: dict[str, dict[str, Any]] = {
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


def net_emulation_section(link: LinkProfile) -> dict[str, Any] | None:
    """The ``cluster.net_emulation`` section of a link profile (``None`` for loopback)."""
    if link.bandwidth_bps is None:
        return None
    return {
        "enabled": True,
        "bandwidth_mbps": link.bandwidth_bps / 1e6,
        "delay_ms": link.latency_s * 1e3,
    }


def job_config(codec: str, link: LinkProfile) -> dict[str, Any]:
    """The job configuration (``{"cluster": {...}}``) of one p2p block."""
    cluster: dict[str, Any] = {"collective": {"init_timeout": 120.0}}
    if codec != "raw":
        cluster["collective"]["tensor_compression"] = dict(COMPRESSION_SECTIONS[codec])
        if codec.endswith("_whole"):  # the per-tensor design: no chunked frames
            cluster["collective"]["compression_pipeline"] = {"chunk_bytes": 0}
        if codec == "auto":  # raw, lz4, zstd or sparse per link, whichever is fastest
            cluster["collective"]["compression_pipeline"] = {"adaptive": True}
        elif codec.endswith("_auto"):  # raw or this one codec per link
            only = {"codecs": [codec.split("_")[0]]}
            cluster["collective"]["compression_pipeline"] = {"adaptive": only}
    net = net_emulation_section(link)
    if net is not None:
        cluster["net_emulation"] = net
    return {"cluster": cluster}
