"""Per-direction counters of the tensors a group moved: compressed or raw, bytes, time."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from p2p_collective._compression._adaptive import LinkAdvisor, Sampler
from p2p_collective._compression._decode_rates import DecodeReporter, FrameDecodes
from p2p_collective._frames._framing import TensorMeta
from p2p_compress.internal import CODEC_RAW


@dataclass
class WireStats:
    """Tensor counters of one direction (the tensors of generic send/recv frames with bytes)."""

    compressed_tensors: int = 0
    raw_tensors: int = 0
    raw_reasons: dict[str, int] = field(default_factory=dict)
    tensor_raw_bytes: int = 0
    tensor_wire_bytes: int = 0
    codec_seconds: float = 0.0
    emulated_seconds: float = 0.0
    chunks: int = 0
    compressed_chunks: int = 0
    chunk_raw_reasons: dict[str, int] = field(default_factory=dict)
    advisor: LinkAdvisor | None = None  # compression_pipeline.adaptive: this link's choice
    sampler: Sampler | None = None  # classifies chunked frames' data (direction thread only)
    reporter: DecodeReporter | None = None  # receiving: decode rates back to the sender
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(
        self,
        metas: list[TensorMeta],
        reasons: list[str] | str | None,
        codec_seconds: float = 0.0,
        emulated_seconds: float = 0.0,
    ) -> None:
        """Count a frame's tensors (those with bytes) and the time spent on them.

        Args:
            metas: The frame's tensor entries, as they went on the wire.
            reasons: Sender only: per tensor with bytes, "" when compressed or why it
                stayed raw; or one reason for all of them.
            codec_seconds: Time spent compressing or decoding them.
            emulated_seconds: Time the link emulation paced them.
        """
        n = comp = raw_bytes = wire_bytes = 0
        for m in metas:
            if m.raw_bytes:
                n += 1
                raw_bytes += m.raw_bytes
                wire_bytes += m.wire_bytes
                if m.codec_id != CODEC_RAW:
                    comp += 1
        with self.lock:
            self.codec_seconds += codec_seconds
            self.emulated_seconds += emulated_seconds
            self.tensor_raw_bytes += raw_bytes
            self.tensor_wire_bytes += wire_bytes
            self.compressed_tensors += comp
            self.raw_tensors += n - comp
            counts = self.raw_reasons
            if type(reasons) is list:
                for r in reasons:
                    if r:
                        counts[r] = counts.get(r, 0) + 1
            elif reasons and n > comp:
                assert isinstance(reasons, str)
                counts[reasons] = counts.get(reasons, 0) + n - comp

    def count_chunks(self, chunks: int, compressed: int, reasons: Mapping[str, int]) -> None:
        """Count the chunks of a chunked frame (sender: with why raw chunks stayed raw)."""
        with self.lock:
            self.chunks += chunks
            self.compressed_chunks += compressed
            for r, n in reasons.items():
                self.chunk_raw_reasons[r] = self.chunk_raw_reasons.get(r, 0) + n

    def report_decodes(self, seq: int, decodes: FrameDecodes) -> None:
        """Receiving: frame ``seq`` was decoded so (sent back to an adaptive sender)."""
        if self.reporter is not None and decodes.per_codec:
            self.reporter.report(seq, decodes)

    def add_seconds(self, codec: float = 0.0, emulated: float = 0.0) -> None:
        """Add codec or pacing time spent outside a counted frame."""
        with self.lock:
            self.codec_seconds += codec
            self.emulated_seconds += emulated

    def as_dict(self) -> dict[str, object]:
        """The counters as a dict.

        Sending with ``adaptive``: ``adaptive``, the link's decision. Receiving with
        compression on: ``decode_reports``, the decode records ``sent`` back to the
        sender and ``dropped`` (the connection's buffer was full).
        """
        advisor, reporter = self.advisor, self.reporter
        extra: dict[str, object] = {} if advisor is None else {"adaptive": advisor.as_dict()}
        if reporter is not None:
            extra["decode_reports"] = {"sent": reporter.sent, "dropped": reporter.dropped}
        with self.lock:
            return extra | {
                "compressed_tensors": self.compressed_tensors,
                "raw_tensors": self.raw_tensors,
                "raw_reasons": dict(self.raw_reasons),
                "tensor_raw_bytes": self.tensor_raw_bytes,
                "tensor_wire_bytes": self.tensor_wire_bytes,
                "codec_seconds": self.codec_seconds,
                "emulated_seconds": self.emulated_seconds,
                "chunks": self.chunks,
                "compressed_chunks": self.compressed_chunks,
                "chunk_raw_reasons": dict(self.chunk_raw_reasons),
            }
