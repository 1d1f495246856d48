"""TensorCodecProvider: the per-process source of codecs for senders and receivers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from p2p_compress._codecs._codec import TensorCodec
from p2p_compress._codecs._lz4 import Lz4Codec
from p2p_compress._codecs._sparse import SparseCodec
from p2p_compress._codecs._zstd import ZstdCodec
from p2p_compress._config import (
    CodecConfig,
    Lz4CodecConfig,
    SparseCodecConfig,
    TensorCompressionConfig,
    ZstdCodecConfig,
)
from p2p_compress._errors import CompressionTimeoutError


class TensorCodecProvider:
    """Hands out codecs: one shared lz4 or sparse codec, or at most ``max_inflight`` zstd contexts.

    lz4 and sparse are stateless: every acquire returns the same codec, without a limit or a lock.
    zstd contexts are exclusive and come from one bounded LIFO stack shared by
    compression and decompression (the most recently released, cache-warm context goes
    out first). Contexts are created on demand, so a provider that never sees an
    eligible tensor creates nothing native. Thread-safe.

    The sender's :meth:`acquire_encoder` never waits: it returns None when every zstd
    context is busy (or a receiver is already waiting for one), and the sender keeps
    the tensors raw. The receiver's :meth:`acquire_decoder` waits, with a timeout,
    because its compressed payload has already arrived.

    Args:
        config: a compression config, or just a codec config.

    Raises:
        TypeError: ``config`` is neither.
        CompressionError: the codec library cannot be loaded (lz4 is loaded here; zstd
            contexts are created at first acquire).

    Example:
        >>> from p2p_compress import ZstdCodecConfig
        >>> provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=1))
        >>> codec = provider.acquire_encoder()
        >>> provider.acquire_encoder() is None  # saturated: the sender stays raw
        True
        >>> provider.release(codec)
        >>> with provider.decoder(timeout=1.0) as dec:
        ...     dec.name
        'zstd'
    """

    def __init__(self, config: TensorCompressionConfig | CodecConfig) -> None:
        codec_config = config.codec if isinstance(config, TensorCompressionConfig) else config
        if not isinstance(codec_config, (Lz4CodecConfig, ZstdCodecConfig, SparseCodecConfig)):
            raise TypeError(
                "config must be a TensorCompressionConfig, Lz4CodecConfig, ZstdCodecConfig or "
                f"SparseCodecConfig, got {type(config).__name__}"
            )
        self.codec_config: CodecConfig = codec_config
        self._cond = threading.Condition(threading.Lock())
        self._shared: Lz4Codec | SparseCodec | None = None
        self._idle: list[ZstdCodec] = []
        self._busy: dict[int, ZstdCodec] = {}
        self._created = 0
        self._waiting = 0
        self._stats = {"encoder_acquired": 0, "encoder_busy": 0, "decoder_acquired": 0}
        self._stats.update({"decoder_waited": 0, "decoder_timeouts": 0})
        if isinstance(codec_config, Lz4CodecConfig):
            self._shared = Lz4Codec(codec_config.acceleration)
            self.max_inflight: int | None = None
        elif isinstance(codec_config, SparseCodecConfig):
            self._shared = SparseCodec()
            self.max_inflight = None
        else:
            self.max_inflight = codec_config.max_inflight

    @property
    def codec_name(self) -> str:
        """``"lz4"``, ``"zstd"`` or ``"sparse"``."""
        return self.codec_config.name

    @property
    def codec_id(self) -> int:
        """The codec's wire id (1 lz4, 2 zstd, 3 sparse)."""
        return self.codec_config.codec_id

    def acquire_encoder(self) -> TensorCodec | None:
        """Take a codec for compression without waiting.

        Returns:
            The codec, or None when all zstd contexts are in use or a receiver waits
            for one (lz4 never returns None). Give it back with :meth:`release`.

        Raises:
            CompressionError: a new zstd context cannot be created.
        """
        if self._shared is not None:
            return self._shared
        with self._cond:
            if self._waiting or self._saturated_locked():
                self._stats["encoder_busy"] += 1
                return None
            codec = self._take_locked()
            self._stats["encoder_acquired"] += 1
        return codec if codec is not None else self._create()

    def acquire_decoder(self, *, timeout: float | None) -> TensorCodec:
        """Take a codec for decompression, waiting for a free zstd context.

        Args:
            timeout: seconds to wait at most; None waits without limit.

        Returns:
            The codec. Give it back with :meth:`release` as soon as decoding ends.

        Raises:
            CompressionTimeoutError: no context became free within ``timeout``.
            CompressionError: a new zstd context cannot be created.
        """
        if self._shared is not None:
            return self._shared
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._cond:
            if self._saturated_locked():
                self._stats["decoder_waited"] += 1
                self._waiting += 1
                try:
                    while self._saturated_locked():
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            self._stats["decoder_timeouts"] += 1
                            raise CompressionTimeoutError(
                                f"no zstd context became free within {timeout} s "
                                f"(max_inflight={self._limit}, all in use)"
                            )
                        self._cond.wait(left)
                finally:
                    self._waiting -= 1
            codec = self._take_locked()
            self._stats["decoder_acquired"] += 1
        return codec if codec is not None else self._create()

    def release(self, codec: TensorCodec) -> None:
        """Give back a codec from :meth:`acquire_encoder` or :meth:`acquire_decoder`.

        Raises:
            ValueError: ``codec`` is not one this provider handed out and still holds.
        """
        if self._shared is not None:
            if codec is not self._shared:
                raise ValueError(f"codec {codec!r} does not belong to this provider")
            return
        with self._cond:
            if self._busy.pop(id(codec), None) is not codec or not isinstance(codec, ZstdCodec):
                raise ValueError(
                    f"codec {codec!r} was not acquired from this provider or is already released"
                )
            self._idle.append(codec)
            self._cond.notify()

    @contextmanager
    def encoder(self) -> Iterator[TensorCodec | None]:
        """Context manager around :meth:`acquire_encoder` / :meth:`release` (may yield None)."""
        codec = self.acquire_encoder()
        try:
            yield codec
        finally:
            if codec is not None:
                self.release(codec)

    @contextmanager
    def decoder(self, *, timeout: float | None) -> Iterator[TensorCodec]:
        """Context manager around :meth:`acquire_decoder` / :meth:`release`."""
        codec = self.acquire_decoder(timeout=timeout)
        try:
            yield codec
        finally:
            self.release(codec)

    def stats(self) -> dict[str, Any]:
        """Return the provider's counters.

        Returns:
            ``codec`` and ``max_inflight`` (None for lz4). For zstd also ``created``
            contexts, ``in_use``, ``idle``, ``waiting`` receivers, ``encoder_acquired``,
            ``encoder_busy`` (sender got None), ``decoder_acquired``, ``decoder_waited``
            and ``decoder_timeouts``. The lz4 path is lock-free and counts nothing.
        """
        if self._shared is not None:
            return {"codec": self.codec_name, "max_inflight": None}
        with self._cond:
            out: dict[str, Any] = {
                "codec": self.codec_name,
                "max_inflight": self.max_inflight,
                "created": self._created,
                "in_use": len(self._busy),
                "idle": len(self._idle),
                "waiting": self._waiting,
            }
            out.update(self._stats)
        return out

    def _saturated_locked(self) -> bool:
        return not self._idle and self._created >= self._limit

    @property
    def _limit(self) -> int:
        assert self.max_inflight is not None
        return self.max_inflight

    def _take_locked(self) -> ZstdCodec | None:
        """Pop an idle context, or reserve a slot for a new one (returns None)."""
        if self._idle:
            codec = self._idle.pop()
            self._busy[id(codec)] = codec
            return codec
        self._created += 1
        return None

    def _create(self) -> ZstdCodec:
        assert isinstance(self.codec_config, ZstdCodecConfig)
        try:
            codec = ZstdCodec(self.codec_config.level)
        except BaseException:
            with self._cond:
                self._created -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._busy[id(codec)] = codec
        return codec

    def __repr__(self) -> str:
        return f"<TensorCodecProvider {self.codec_name} max_inflight={self.max_inflight}>"
