"""WireCodec: the compression state one Collective shares with all its groups."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import Any

from p2p_collective._compression._settings import CompressionPipelineConfig
from p2p_collective._framing import TensorMeta
from p2p_collective._jobs import Worker
from p2p_compress import (
    TensorBufferPool,
    TensorBufferPoolConfig,
    TensorCodecProvider,
    TensorCompressionConfig,
)


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
        self._provider: TensorCodecProvider | None = None
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

    def provider(self) -> TensorCodecProvider:
        """The codec provider, created at the first call (the first eligible tensor)."""
        provider = self._provider
        if provider is None:
            with self._lock:
                if self._provider is None:
                    self._provider = TensorCodecProvider(self.config)
                provider = self._provider
        return provider

    def stats(self) -> dict[str, Any]:
        """``pool`` (buffer pool counters) and ``codec`` (provider counters, None until used)."""
        provider = self._provider
        return {
            "codec": None if provider is None else provider.stats(),
            "pool": self.pool.stats(),
        }

    def close(self) -> None:
        """Stop the worker threads (queued jobs are run by whoever needs them)."""
        self.compressor.close()
        self.decoder.close()
