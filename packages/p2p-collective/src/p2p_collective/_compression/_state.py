"""WireCodec: the compression state one Collective shares with all its groups."""

from __future__ import annotations

import os
import threading
from typing import Any

from p2p_collective._compression._settings import CompressionPipelineConfig
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
        self.compressor = Worker("p2p-compress", min(threads, cpus, inflight))
        self.decoder = Worker("p2p-decompress", min(pipeline.decoder_threads, cpus))

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
