"""WireCodec: the compression state one Collective shares with all its groups."""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from p2p_collective._compression._jobs import Worker
from p2p_collective._compression._settings import CompressionPipelineConfig
from p2p_collective._frames._framing import TensorMeta
from p2p_compress import (
    Lz4CodecConfig,
    SparseCodecConfig,
    TensorBufferPool,
    TensorBufferPoolConfig,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodecConfig,
)

CODEC_IDS = {
    "lz4": Lz4CodecConfig.codec_id,
    "zstd": ZstdCodecConfig.codec_id,
    "sparse": SparseCodecConfig.codec_id,
}
"""Wire ids of the codecs a receiver decodes whatever its own ``codec`` is."""


def _config_for(config: TensorCompressionConfig, codec_id: int) -> TensorCompressionConfig:
    """``config`` with codec ``codec_id``: its own parameters if it is the job's, else defaults."""
    if codec_id == config.codec_id:
        return config
    others = {c.codec_id: c for c in (Lz4CodecConfig(), ZstdCodecConfig(), SparseCodecConfig())}
    return replace(config, codec=others[codec_id])


class WireCodec:
    """Compression state of one Collective: config, buffer pool, lazy codec provider, threads.

    Args:
        config: The job's ``tensor_compression`` section.
        pool: The job's ``tensor_buffer_pool`` section.
        pipeline: The job's ``compression_pipeline`` section (None: its defaults).
    """

    def __init__(
        self,
        config: TensorCompressionConfig,
        pool: TensorBufferPoolConfig,
        pipeline: CompressionPipelineConfig | None = None,
    ) -> None:
        self.config = config
        self.pipeline = pipeline = pipeline or CompressionPipelineConfig()
        self.pool = TensorBufferPool.from_config(pool)
        self._providers: dict[int, TensorCodecProvider] = {}
        self._lock = threading.Lock()
        # zstd contexts beyond max_inflight would only make compressors go raw
        threads = pipeline.compressor_threads
        inflight = getattr(config.codec, "max_inflight", threads)
        cpus = os.cpu_count() or 1
        self.compressor_threads = min(threads, cpus, inflight)
        self.compressor = Worker("p2p-compress", self.compressor_threads)
        # Chunks of a tensor already found eligible: no size or dtype rule per chunk.
        self.chunk_config = replace(config, min_bytes=0, excluded_dtypes=())
        self.decoder = Worker("p2p-decompress", min(pipeline.decoder_threads, cpus))
        # chunks of one frame decoded at once (without overlap: one after another)
        self.decoder_threads = min(pipeline.decoder_threads, cpus) if pipeline.overlap else 1
        self._configs = {i: _config_for(config, i) for i in CODEC_IDS.values()}
        self._chunk_configs = {
            i: replace(c, min_bytes=0, excluded_dtypes=()) for i, c in self._configs.items()
        }
        adaptive = pipeline.adaptive
        self.adaptive_ids: tuple[int, ...] = (
            () if adaptive is None else tuple(CODEC_IDS[n] for n in adaptive.codecs)
        )

    def config_for(self, codec_id: int | None = None) -> TensorCompressionConfig:
        """The compression config of codec ``codec_id`` (None: the job's codec)."""
        return self.config if codec_id is None else self._configs[codec_id]

    def chunk_config_for(self, codec_id: int | None = None) -> TensorCompressionConfig:
        """Like :meth:`config_for`, without size or dtype rules (for chunks)."""
        return self.chunk_config if codec_id is None else self._chunk_configs[codec_id]

    def eligible(self, meta: TensorMeta) -> bool:
        """Whether a tensor is a compression candidate: ``min_bytes`` and a dtype not excluded.

        The same rule for every frame, inline or not (seed 000: ``min_bytes`` skips tensors
        whose raw byte count is below it, nothing else does).
        """
        cfg = self.config
        return meta.raw_bytes >= cfg.min_bytes and meta.dtype not in cfg.excluded_dtypes

    def raw_reason(self, meta: TensorMeta) -> str:
        """Why a tensor that is not :meth:`eligible` stays raw (seed 000's check order)."""
        return "below_min_bytes" if meta.raw_bytes < self.config.min_bytes else "excluded_dtype"

    def provider(self, codec_id: int | None = None) -> TensorCodecProvider:
        """The provider of codec ``codec_id`` (None: the job's), created at its first use.

        Raises:
            KeyError: ``codec_id`` is not lz4's, zstd's or sparse's (callers check first).
        """
        key = self.config.codec_id if codec_id is None else codec_id
        provider = self._providers.get(key)
        if provider is None:
            with self._lock:
                provider = self._providers.get(key)
                if provider is None:
                    provider = TensorCodecProvider(self._configs[key])
                    self._providers[key] = provider
        return provider

    def stats(self) -> dict[str, object]:
        """``pool`` (buffer pool counters) and ``codec`` (provider counters, None until used).

        When a link used (or a peer sent) another codec than the job's, ``other_codecs``
        holds its provider's counters by codec name.
        """
        mine = self._providers.get(self.config.codec_id)
        out: dict[str, object] = {
            "codec": None if mine is None else mine.stats(),
            "pool": self.pool.stats(),
        }
        others = {
            p.codec_name: p.stats() for i, p in self._providers.items() if i != self.config.codec_id
        }
        if others:
            out["other_codecs"] = others
        return out

    def close(self) -> None:
        """Stop the worker threads (queued jobs are run by whoever needs them)."""
        self.compressor.close()
        self.decoder.close()
