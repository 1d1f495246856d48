"""``cluster.collective.compression_pipeline``: how codec work is scheduled around the wire.

Seed 000's ``tensor_compression`` section says *what* is compressed (codec, ``min_bytes``,
``excluded_dtypes``); this section says *how* the work is laid out over threads and the
wire. It is local to each process (not part of the wire fingerprint): a receiver learns
everything it needs from the frames themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from p2p_collective._validate import fail as _fail
from p2p_collective._validate import mapping as _mapping

DEFAULT_COMPRESSOR_THREADS: Final = 1
DEFAULT_DECODER_THREADS: Final = 1
MAX_THREADS: Final = 64
DEFAULT_CHUNK_BYTES: Final = 1 << 20
MIN_CHUNK_BYTES: Final = 1 << 16
MAX_CHUNK_BYTES: Final = 1 << 30
_KEYS: Final = ("overlap", "compressor_threads", "decoder_threads", "chunk_bytes", "adaptive")
ADAPTIVE_CODECS: Final = ("lz4", "zstd", "sparse")
"""The codecs an adaptive link may choose from (besides raw)."""
DEFAULT_PROBE_EVERY: Final = 8
_ADAPTIVE_KEYS: Final = ("codecs", "probe_every")


def _threads(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise _fail(path, value, f"an integer from 1 to {MAX_THREADS}")
    return int(value)


def _chunk_bytes(value: object, path: str) -> int:
    allowed = f"0 (no chunks) or an integer from {MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, value, allowed)
    if value != 0 and not MIN_CHUNK_BYTES <= value <= MAX_CHUNK_BYTES:
        raise _fail(path, value, allowed)
    return int(value)


def _flag(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, value, "true or false")
    return value


def _codecs(value: object, path: str) -> tuple[str, ...]:
    allowed = f"a non-empty list of distinct codec names from {list(ADAPTIVE_CODECS)}"
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise _fail(path, value, allowed)
    for i, name in enumerate(value):
        if name not in ADAPTIVE_CODECS:
            raise _fail(
                f"{path}[{i}]", name, f"one of {list(ADAPTIVE_CODECS)}", choices=ADAPTIVE_CODECS
            )
    if len(set(value)) != len(value):
        raise _fail(path, value, allowed)
    return tuple(value)


@dataclass(frozen=True)
class AdaptiveConfig:
    """``compression_pipeline.adaptive`` as a mapping: how a link picks raw or a codec.

    Attributes:
        codecs: The codecs a link may choose from besides raw, any of ``lz4``, ``zstd``
            and ``sparse`` (lz4 and zstd with the parameters of ``tensor_compression``
            when it is the job's codec, else their defaults: lz4 acceleration 1, zstd
            level 1; ``sparse`` is :class:`~p2p_compress.SparseCodec`, zero-word
            elision for mostly-zero tensors). The receiver decodes any of them whatever
            its own ``codec`` is. Default all three.
        probe_every: Every this many frames a link re-measures what it is not using
            (one chunk with another codec; on a real link, a raw frame while it
            compresses), 2 to 1000. Default 8.

    Example:
        >>> AdaptiveConfig().codecs
        ('lz4', 'zstd', 'sparse')
        >>> AdaptiveConfig(codecs=("lz5",))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        p2p_asyncwork...ConfigError: codecs[0]: got 'lz5'; allowed: one of ['lz4', ...
    """

    codecs: tuple[str, ...] = ADAPTIVE_CODECS
    probe_every: int = DEFAULT_PROBE_EVERY

    def __post_init__(self) -> None:
        object.__setattr__(self, "codecs", _codecs(self.codecs, "codecs"))
        _probe_every(self.probe_every, "probe_every")

    def to_dict(self) -> dict[str, object]:
        """The mapping form that :func:`parse_compression_pipeline` accepts."""
        return {"codecs": list(self.codecs), "probe_every": self.probe_every}


def _probe_every(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 1000:
        raise _fail(path, value, "an integer from 2 to 1000")
    return int(value)


def _adaptive(value: object, path: str) -> AdaptiveConfig | None:
    shape = (
        "true (raw, lz4, zstd or sparse per link), false, or a mapping with keys codecs,"
        " probe_every"
    )
    if isinstance(value, bool):
        return AdaptiveConfig() if value else None
    if isinstance(value, AdaptiveConfig):
        return value
    if not isinstance(value, Mapping):
        raise _fail(path, value, shape)
    sec = _mapping(value, path, _ADAPTIVE_KEYS, shape)
    return AdaptiveConfig(
        codecs=_codecs(sec.get("codecs", list(ADAPTIVE_CODECS)), f"{path}.codecs"),
        probe_every=_probe_every(
            sec.get("probe_every", DEFAULT_PROBE_EVERY), f"{path}.probe_every"
        ),
    )


@dataclass(frozen=True)
class CompressionPipelineConfig:
    """Threads and overlap of compression on the wire (one Collective's codec work).

    Attributes:
        overlap: Codec work overlaps the wire: an asynchronous ``send`` is compressed
            on a compressor thread while earlier frames are on the wire, and a received
            payload is decoded on a decoder thread while the next one arrives. False
            runs all codec work in the direction threads (for measuring). Default true.
        compressor_threads: Compressor threads per Collective, 1 to 64 (also bounded by
            the CPU count and zstd's ``max_inflight``). Default 1: one keeps a stream's
            next frames compressed while one is on the wire; every sending direction
            thread also compresses its own frame when no compressor has started it.
        decoder_threads: Decoder threads per Collective, 1 to 64. Default 1.
        chunk_bytes: Chunked frames: when a frame's eligible tensors hold at least twice
            this many bytes, they are compressed in chunks of this size that go on the
            wire as each is ready (compressed on the compressor threads, in parallel,
            while earlier chunks travel), and the receiver decodes chunk *k* while chunk
            *k* + 1 arrives. Keep-if-smaller and raw reasons apply per chunk. 0 turns
            chunking off; else 65536 to 1 GiB. Default 1 MiB.
        adaptive: Per link, the fastest of raw and the codecs in
            :attr:`AdaptiveConfig.codecs`: each sending direction learns its link's
            delivered rate (an emulated link: its emulated bandwidth) and each codec's
            throughput and ratio per dtype from its own traffic, predicts the time each
            way would take, and takes the fastest (eligible tensors sent raw get the
            reason ``adaptive``). The decision and its reason are in the group's
            ``stats()`` under ``adaptive``. ``true`` is :class:`AdaptiveConfig`'s
            defaults, a mapping sets its keys; None (``false``, the default) sends
            every eligible tensor with the job's codec.

    Example:
        >>> CompressionPipelineConfig().compressor_threads
        1
        >>> CompressionPipelineConfig(compressor_threads=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        p2p_asyncwork...ConfigError: compressor_threads: got 0; allowed: an integer from 1 to 64
    """

    overlap: bool = True
    compressor_threads: int = DEFAULT_COMPRESSOR_THREADS
    decoder_threads: int = DEFAULT_DECODER_THREADS
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    adaptive: AdaptiveConfig | None = None

    def __post_init__(self) -> None:
        if self.adaptive is not None:
            object.__setattr__(self, "adaptive", _adaptive(self.adaptive, "adaptive"))
        _flag(self.overlap, "overlap")
        _threads(self.compressor_threads, "compressor_threads")
        _threads(self.decoder_threads, "decoder_threads")
        _chunk_bytes(self.chunk_bytes, "chunk_bytes")

    def to_dict(self) -> dict[str, object]:
        """The section as a plain dict that :func:`parse_compression_pipeline` accepts."""
        return {
            "overlap": self.overlap,
            "compressor_threads": self.compressor_threads,
            "decoder_threads": self.decoder_threads,
            "chunk_bytes": self.chunk_bytes,
            "adaptive": False if self.adaptive is None else self.adaptive.to_dict(),
        }


def parse_compression_pipeline(
    section: Mapping[str, object] | None, path: str = "cluster.collective.compression_pipeline"
) -> CompressionPipelineConfig:
    """Parse the ``compression_pipeline`` section (None: all defaults).

    Raises:
        ConfigError: An unknown key or a bad value; the message names the key path,
            the value and what is allowed.

    Example:
        >>> parse_compression_pipeline({"compressor_threads": 2}).compressor_threads
        2
    """
    if section is None:
        return CompressionPipelineConfig()
    sec = _mapping(section, path, _KEYS, "a mapping of keys to values (or omit the section)")
    return CompressionPipelineConfig(
        overlap=_flag(sec.get("overlap", True), f"{path}.overlap"),
        adaptive=_adaptive(sec.get("adaptive", False), f"{path}.adaptive"),
        compressor_threads=_threads(
            sec.get("compressor_threads", DEFAULT_COMPRESSOR_THREADS), f"{path}.compressor_threads"
        ),
        decoder_threads=_threads(
            sec.get("decoder_threads", DEFAULT_DECODER_THREADS), f"{path}.decoder_threads"
        ),
        chunk_bytes=_chunk_bytes(
            sec.get("chunk_bytes", DEFAULT_CHUNK_BYTES), f"{path}.chunk_bytes"
        ),
    )
