"""Measuring codecs on representative tensors and recommending a configuration."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from p2p_compress._codecs._codec import TensorCodec
from p2p_compress._codecs._lz4 import Lz4Codec
from p2p_compress._codecs._shuffle import shuffle_bytes, shuffle_itemsize, unshuffle_bytes
from p2p_compress._codecs._zstd import ZstdCodec
from p2p_compress._config import (
    DEFAULT_MIN_BYTES,
    Lz4CodecConfig,
    TensorCompressionConfig,
    ZstdCodecConfig,
)
from p2p_compress._dtypes import dtype_name
from p2p_compress._errors import CompressionError

CodecConfig = Lz4CodecConfig | ZstdCodecConfig
DEFAULT_CHUNK_BYTES = 1 << 20
"""p2p-collective's default ``compression_pipeline.chunk_bytes`` (chunked frames)."""


def setting_label(codec: CodecConfig) -> str:
    """``"lz4 acceleration=1"`` / ``"zstd level=3"``."""
    if isinstance(codec, Lz4CodecConfig):
        return f"lz4 acceleration={codec.acceleration}"
    return f"zstd level={codec.level}"


@dataclass(frozen=True)
class Measurement:
    """One tensor through one codec setting (best of the repeats)."""

    tensor: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    setting: CodecConfig
    raw_bytes: int
    wire_bytes: int
    compress_s: float
    decompress_s: float
    shuffled: bool = False  # byte-shuffled first, as chunked frames send this tensor

    @property
    def label(self) -> str:
        """The codec setting, with ``+shuffle`` when the bytes were shuffled first."""
        return setting_label(self.setting) + (" +shuffle" if self.shuffled else "")

    @property
    def ratio(self) -> float:
        """Raw / compressed bytes."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else float("inf")

    @property
    def shrinks(self) -> bool:
        """True when the compressed form is smaller (the plan would keep it)."""
        return self.wire_bytes < self.raw_bytes

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        mb = self.raw_bytes / 1e6
        return {
            "tensor": self.tensor,
            "dtype": dtype_name(self.dtype),
            "shape": list(self.shape),
            "codec": setting_label(self.setting),
            "shuffled": self.shuffled,
            "raw_bytes": self.raw_bytes,
            "compressed_bytes": self.wire_bytes,
            "ratio": round(self.ratio, 4),
            "compress_mb_s": round(mb / self.compress_s, 1) if self.compress_s else None,
            "decompress_mb_s": round(mb / self.decompress_s, 1) if self.decompress_s else None,
        }


def _best_time(func: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def _make_codec(setting: CodecConfig) -> TensorCodec:
    if isinstance(setting, Lz4CodecConfig):
        return Lz4Codec(setting.acceleration)
    return ZstdCodec(setting.level)


def measure(
    tensors: Sequence[tuple[str, torch.Tensor]],
    settings: Sequence[CodecConfig],
    *,
    repeat: int = 3,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[Measurement]:
    """Compress and decompress every tensor with every setting, checking the round trip.

    A tensor of two chunks or more whose bytes p2p-collective's chunked frames would
    byte-shuffle first (:func:`~p2p_compress.internal.shuffle_itemsize`) is measured that way:
    shuffle and compress, decompress and unshuffle.

    Args:
        tensors: (name, contiguous CPU tensor) pairs.
        settings: codec configs to try.
        repeat: timed runs per direction; the best is kept.
        chunk_bytes: p2p-collective's ``compression_pipeline.chunk_bytes`` (0: no chunked
            frames, nothing is shuffled).

    Returns:
        One measurement per tensor and setting, tensors outermost.

    Raises:
        CompressionError: a round trip did not restore the bytes.
    """
    codecs = [(s, _make_codec(s)) for s in settings]
    out: list[Measurement] = []
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        chunked = chunk_bytes and nbytes >= 2 * chunk_bytes
        itemsize = shuffle_itemsize(tensor.dtype, _bytes_of(tensor)) if chunked else 0
        for setting, codec in codecs:
            row = _measure_one(name, tensor, setting, codec, repeat, itemsize)
            if row is not None:
                out.append(row)
    return out


def _measure_one(
    name: str,
    tensor: torch.Tensor,
    setting: CodecConfig,
    codec: TensorCodec,
    repeat: int,
    itemsize: int = 0,
) -> Measurement | None:
    nbytes = tensor.numel() * tensor.element_size()
    bound = codec.max_compressed_size(nbytes)
    if bound is None:
        return None
    buffer = torch.empty(bound, dtype=torch.uint8)
    target = torch.empty_like(tensor)
    src, dst = _bytes_of(tensor), _bytes_of(target)
    planes = torch.empty(nbytes if itemsize else 0, dtype=torch.uint8)

    def compress() -> int:
        if itemsize:
            shuffle_bytes(src, planes, itemsize)
            return codec.compress_into(planes, buffer)
        return codec.compress_into(tensor, buffer)

    written = compress()
    comp = _best_time(compress, repeat)
    payload = buffer[:written]

    def decompress() -> None:
        if itemsize:
            codec.decompress_into(payload, planes)
            unshuffle_bytes(planes, dst, itemsize)
        else:
            codec.decompress_into(payload, target)

    decomp = _best_time(decompress, repeat)
    if not torch.equal(dst, src):
        raise CompressionError(f"{setting_label(setting)} did not restore tensor {name}")
    shape = tuple(tensor.shape)
    return Measurement(
        name, tensor.dtype, shape, setting, nbytes, written, comp, decomp, bool(itemsize)
    )


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


@dataclass(frozen=True)
class Recommendation:
    """The advised configuration and the estimate behind it.

    Attributes:
        config: the advised section, or None to keep the raw path.
        raw_s: estimated seconds for one message of all tensors sent raw.
        best_s: estimated seconds with ``config`` (``raw_s`` when None).
        per_setting: estimated seconds per setting label, with its own best exclusions.
        link_bytes_per_s: the assumed link bandwidth.
    """

    config: TensorCompressionConfig | None
    raw_s: float
    best_s: float
    per_setting: dict[str, float]
    link_bytes_per_s: float


def codec_seconds(m: Measurement, link: float, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> float:
    """Estimated seconds to move ``m``'s tensor compressed over a link of ``link`` bytes/s.

    A tensor of at least two chunks travels as p2p-collective's chunked frames do:
    compressing, the wire and decoding overlap, so the slowest of the three sets the
    pace, plus the first chunk's compression and the last one's decoding (the pipeline
    filling and draining). A smaller one is compressed, sent and decoded in a row.
    ``chunk_bytes`` 0: always in a row (``compression_pipeline.chunk_bytes: 0``).
    """
    wire = m.wire_bytes / link
    if chunk_bytes and m.raw_bytes >= 2 * chunk_bytes:
        fill = (m.compress_s + m.decompress_s) * chunk_bytes / m.raw_bytes
        return max(m.compress_s, wire, m.decompress_s) + fill
    return m.compress_s + wire + m.decompress_s


def _estimate(
    rows: Iterable[Measurement], small_bytes: int, link: float, chunk_bytes: int
) -> tuple[float, tuple[torch.dtype, ...]]:
    by_dtype: dict[torch.dtype, tuple[float, float]] = {}
    for m in rows:
        raw_t = m.raw_bytes / link
        codec_t = codec_seconds(m, link, chunk_bytes) if m.shrinks else m.compress_s + raw_t
        raw_sum, codec_sum = by_dtype.get(m.dtype, (0.0, 0.0))
        by_dtype[m.dtype] = (raw_sum + raw_t, codec_sum + codec_t)
    excluded = tuple(d for d, (r, c) in by_dtype.items() if c >= r)
    total = small_bytes / link + sum(min(r, c) for r, c in by_dtype.values())
    return total, excluded


def recommend(
    measurements: Sequence[Measurement],
    *,
    link_bytes_per_s: float,
    small_bytes: int = 0,
    min_bytes: int = DEFAULT_MIN_BYTES,
    min_gain: float = 0.03,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Recommendation:
    """Pick the setting with the lowest estimated message time over a link.

    The estimate per tensor is :func:`codec_seconds` when the codec shrinks it (the
    slowest of compressing, the wire and decoding for a tensor of two chunks or more,
    the three in a row for a smaller one), else compress + raw / link; a dtype is
    excluded when the codec does not pay off over all its tensors. Compression is
    advised only when it saves at least ``min_gain`` of the raw time. This is the model
    p2p-collective's adaptive mode (``compression_pipeline.adaptive``) applies per link
    to the figures it learns from live traffic.

    Args:
        measurements: the output of :func:`measure`.
        link_bytes_per_s: the link's bandwidth in bytes per second.
        small_bytes: bytes of tensors below ``min_bytes`` (sent raw, not measured).
        min_bytes: the ``min_bytes`` to put in the advice.
        min_gain: the fraction of raw time compression must save.
        chunk_bytes: p2p-collective's ``compression_pipeline.chunk_bytes`` (0: no chunks).

    Returns:
        The recommendation.
    """
    raw_s = small_bytes / link_bytes_per_s
    seen: set[str] = set()
    for m in measurements:
        if m.tensor not in seen:
            seen.add(m.tensor)
            raw_s += m.raw_bytes / link_bytes_per_s
    per: dict[str, float] = {}
    best: tuple[float, CodecConfig, tuple[torch.dtype, ...]] | None = None
    settings = list(dict.fromkeys(m.setting for m in measurements))
    for setting in settings:
        rows = [m for m in measurements if m.setting == setting]
        total, excluded = _estimate(rows, small_bytes, link_bytes_per_s, chunk_bytes)
        per[setting_label(setting)] = total
        if best is None or total < best[0]:
            best = (total, setting, excluded)
    if best is None or best[0] > raw_s * (1.0 - min_gain):
        return Recommendation(None, raw_s, raw_s, per, link_bytes_per_s)
    config = TensorCompressionConfig(codec=best[1], min_bytes=min_bytes, excluded_dtypes=best[2])
    return Recommendation(config, raw_s, best[0], per, link_bytes_per_s)


def render_yaml(rec: Recommendation) -> str:
    """Render the advice as a ``cluster.collective`` YAML block with a comment line."""
    gbit = rec.link_bytes_per_s * 8 / 1e9
    head = (
        f"# estimated per message over {gbit:g} Gbit/s: raw {rec.raw_s * 1e3:.3f} ms, "
        f"advised {rec.best_s * 1e3:.3f} ms"
    )
    adaptive = (
        "# links differ (shared memory, loopback, 10 Gbit, 1 Gbit)? compression_pipeline:"
        " {adaptive: true} picks raw, lz4 or zstd per link from live traffic"
    )
    if rec.config is None:
        return (
            f"{head}\n# compression does not pay off for this payload: omit the section\n"
            f"{adaptive}\n"
            "cluster:\n  collective:\n    # tensor_compression: (omitted: raw path)\n"
        )
    lines = [head, adaptive, "cluster:", "  collective:", "    tensor_compression:"]
    for key, value in rec.config.to_dict().items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list):
            text = "[" + ", ".join(value) + "]"
        else:
            text = str(value)
        lines.append(f"      {key}: {text}")
    return "\n".join(lines) + "\n"
