"""Adaptive compression per link: raw, lz4, zstd or sparse, the fastest, learned from traffic.

With ``compression_pipeline.adaptive`` each sending direction (one link) keeps a
:class:`LinkAdvisor`. It learns, from the frames it sends:

* the link's delivered rate: bytes over the time spent putting them on the link (the
  transport's send calls and, on an emulated link, pacing), from frames sent raw only
  (a compressed stream is slowed by the receiver's decoding, which is not the link);
  an emulated link is judged by its emulated bandwidth instead, which is what it
  stands for;
* per codec and data class: the codec's throughput (raw bytes per second of one
  compressor call, measured in wall time, so a busy machine shows as a slower codec) and
  its ratio. A frame's data class is the dtype of its largest eligible tensor and, for
  a chunked frame, the ratio class of a 16 KiB lz4 sample of that tensor
  (:meth:`Sampler.sample_class`: ``float32:c0`` does not shrink, ``float32:c2`` shrinks
  1.5-3x), so sparse and random float32 on one link keep figures of their own; a class
  whose chunks are byte-shuffled before compression ends in ``:s`` (``int64:c2:s``);
* per codec and data class: the receiver's decode rate (raw bytes per second of one
  decode call, unshuffle included, wall time), **measured by the receiver** and sent
  back on the direction's liveness connection, blended with the sender's own probes
  decoded aside while it sends raw (:mod:`~p2p_collective._compression._decode_rates`
  says why that path). Before the first figure of a class arrives, decoding is taken as
  :data:`DECODE_SPEEDUP` (shuffled classes: :data:`SHUFFLED_DECODE_SPEEDUP`) times as
  fast as compressing.

Compressing is timed in wall time on purpose, not the thread's CPU time: the compress
stage's pace is ``threads`` calls at once, and when other work (the receiver on the same
host, another process) shares the cores, each call's wall time is what the stage
delivers; CPU time would promise ``threads`` times an idle core's rate on a busy
machine. (What deflated the figures before was the decode term taking the same
compress figure a second time, times a constant; it is measured now.)

Shared memory that is not emulated is never compressed and never probed: its "wire" is
a memory copy on this host's CPUs, and any codec's pass over the same bytes (then a
decoder's on the same host) costs more than the copy it would shorten. The advisor
learns the link's transport from the first frame it sends (raw, as every first frame).

On a real link a waiting receiver only makes sends look slower, so the delivered rate
is the larger of a new sample and the running estimate (which then follows a slower
link within a few raw frames).

From these it predicts the seconds per raw byte of each way to send a frame:

* raw: ``1 / link``;
* a chunked frame with a codec (compression, wire and decoding overlap, the slowest
  sets the pace): ``max(1 / (codec * threads), 1 / (ratio * link), 1 / (decode *
  decoders))`` (``decoders``: the receiver's decoder threads, from its records);
* a frame too small for chunks (compress, send, decode one after another):
  ``1 / codec + 1 / (ratio * link) + 1 / decode``.

The fastest wins; a codec must beat raw by ``MARGIN`` and a change of codec must beat
the current one by ``HYSTERESIS`` (so near-ties do not flap); on a real link a turn from raw to a
codec is confirmed first (:meth:`LinkAdvisor._confirm`: one more raw frame, the codec
probed aside, then the next frame of that data class decides). Eligible tensors sent raw
get the reason ``adaptive``. Learning: the first two frames go raw (the link's rate, the
first one paying connection and first-touch costs; not needed on an emulated link),
then one frame per data class whose chunks take turns
with each codec (a frame too small for chunks: one frame per codec); that frame's first
256 KiB are also compressed and decoded aside with each codec, a decode figure of the
sender's own until the receiver's arrive (the receiver's first decodes run cold).
Every ``probe_every``-th frame probes another codec, in turn, on one chunk (while
sending raw: 256 KiB compressed and decoded aside, the frame still raw; a frame too
small for chunks: the whole frame); while compressing over a real (not emulated) link,
that frame (and the 2nd and 4th frames after each turn to a codec,
:data:`EARLY_REFRESH`) goes raw instead, to refresh the link's rate, and the codec probe
comes half-way between. A chunked frame sent raw goes as one plain frame, not in chunks
(chunk descriptors cost on a fast link). So a change of data
or link is noticed both ways. The decision, its reason and the figures are in
``stats()``.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from typing import Final

import torch

from p2p_collective._compression._decode_rates import DecodeFigures
from p2p_compress import Lz4Codec, TensorCodec, shuffle_bytes, unshuffle_bytes
from p2p_compress.internal import CODEC_NAMES

EWMA: Final = 0.3
"""Weight of a new observation in the running estimates."""
MIN_RATIO: Final = 1.05
"""A codec whose ratio is below this is never chosen (the data does not shrink)."""
MARGIN: Final = 1.1
"""A codec must be predicted this much faster than raw to be chosen."""
HYSTERESIS: Final = 1.05
"""Another codec must be predicted this much faster than the current one."""
DECODE_SPEEDUP: Final[dict[int, float]] = {1: 3.0, 2: 2.5, 3: 0.5}
"""Per codec id, decoding is taken as this many times faster than compressing until the
receiver's (or a probe's) measured figure for the data class is in (``bench_codec_chunks.py``
measures lz4 3-4x, zstd 2.5-3x, and sparse 0.5-0.8x: it compresses in a few passes but
writes every word back)."""
SHUFFLED: Final = ":s"
"""The suffix of a data class whose chunks are byte-shuffled before compression."""
SHUFFLED_DECODE_SPEEDUP: Final[dict[int, float]] = {1: 0.6, 2: 0.5}
"""The same default for byte-shuffled chunks (until a measured figure is in): lz4 on the
shuffled bytes is fast both ways, so the shuffle and the unshuffle pass set the pace,
and the unshuffle (8-byte elements: a strided write) runs at about 0.6x the shuffle's
rate (1.37 vs 0.85 GB/s on one thread here;
``bench_codec_chunks.py`` at load 13, int64 token ids: lz4+shuffle 671 / 667 MB/s
compress / decode, zstd-1+shuffle 449 / 317). With 1x an emulated 10 Gbit/s link and gloo
over loopback took lz4 for token ids at 2 GB/s, which the decoder could not keep up with."""
LINK_SAMPLES: Final = 2
"""Raw frames a real link sends before it is judged (the first one pays the cold start)."""
EARLY_REFRESH: Final = (2, 4)
"""Decided frames, counted from a turn to a codec (the first frame with it is 1), that a
real link sends raw while compressing, besides every ``probe_every``-th: its first raw
frames run cold (connection, first touch of pages), and a busy host slows a few raw
frames, so a fast link can look slower than the codecs for a while; these find out
within a few frames instead of ``probe_every`` (a wrong turn costs one compressed
frame)."""
MIN_OBSERVED_BYTES: Final = 64 * 1024
"""Sends smaller than this say little about a link's rate (latency dominates)."""
SAMPLE_BYTES: Final = 16 * 1024
"""The bytes of a chunked frame's largest eligible tensor that classify its data."""
PROBE_BYTES: Final = 256 * 1024
"""The bytes a link sending raw compresses aside to refresh a codec's figures."""
MEMORY_LINK: Final = "shm"
"""The transport whose link is a memory copy on this host (never compressed unless emulated)."""
MEMORY_REASON: Final = (
    "raw: shared memory (a memory copy on this host; every codec's pass over the bytes"
    " costs more than the copy it would save)"
)
CLASS_BOUNDS: Final = (1.1, 1.5, 3.0, 6.0, 12.0)
"""lz4 sample ratios that separate the data classes (wide, so data sits well inside one)."""


class Sampler:
    """Classifies a tensor's data by how well lz4 shrinks a 16 KiB sample of it.

    One per sending direction (only its direction thread uses it): an lz4 codec and
    scratch buffers, reused for every frame. It also compresses and decodes a 256 KiB
    probe aside (:meth:`measure`) for a link sending raw, so raw frames go unchunked.
    """

    def __init__(self) -> None:
        self._codec = Lz4Codec()
        bound = self._codec.max_compressed_size(SAMPLE_BYTES)
        assert bound is not None
        self._buffer = torch.empty(bound, dtype=torch.uint8)
        self._scratch: torch.Tensor | None = None
        self._planes = torch.empty(PROBE_BYTES, dtype=torch.uint8)  # shuffled bytes
        self._decoded = torch.empty(PROBE_BYTES, dtype=torch.uint8)

    def measure(
        self, codec: TensorCodec, data: torch.Tensor, itemsize: int = 0
    ) -> tuple[int, int, float, float]:
        """Compress ``data``'s first 256 KiB (flat uint8) aside with ``codec``, then decode it.

        As a chunk goes: byte-shuffled first when ``itemsize`` is given (timed with the
        compression), unshuffled after decoding (timed with the decoding).

        Returns:
            Raw bytes, compressed bytes, compress seconds (for
            :meth:`LinkAdvisor.observe_codec`) and decode seconds (for
            :meth:`LinkAdvisor.observe_decode`).

        Raises:
            CompressionError: The codec failed.
        """
        head = data[:PROBE_BYTES]
        n = int(head.numel())
        bound = codec.max_compressed_size(n)
        assert bound is not None
        if self._scratch is None or self._scratch.numel() < bound:
            self._scratch = torch.empty(bound, dtype=torch.uint8)
        planes, decoded = self._planes[:n], self._decoded[:n]
        t0 = time.perf_counter()
        if itemsize:
            shuffle_bytes(head, planes, itemsize)
            head = planes
        wire = codec.compress_into(head, self._scratch)
        t1 = time.perf_counter()
        if itemsize:
            codec.decompress_into(self._scratch[:wire], decoded)
            unshuffle_bytes(decoded, planes, itemsize)
        else:
            codec.decompress_into(self._scratch[:wire], decoded)
        return n, wire, t1 - t0, time.perf_counter() - t1

    def sample_class(self, data: torch.Tensor) -> int:
        """The ratio class of ``data``'s first 16 KiB (flat uint8) by :data:`CLASS_BOUNDS`.

        0: lz4 shrinks it less than 1.1x, 1: 1.1-1.5x, 2: 1.5-3x, 3: 3-6x, 4: 6-12x,
        5: more.
        """
        head = data[:SAMPLE_BYTES]
        n = int(head.numel())
        if n == 0:
            return 0
        ratio = n / max(self._codec.compress_into(head, self._buffer), 1)
        return bisect.bisect_right(CLASS_BOUNDS, ratio)


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


@dataclass(frozen=True)
class Choice:
    """How one frame's eligible tensors go.

    Attributes:
        codec: The codec id to compress them with; None: raw (reason ``adaptive``).
        probe: A codec id to compress one chunk with instead (a frame too small for
            chunks: the whole frame), refreshing that codec's figures; else None.
        learn: Codec ids to take turns chunk by chunk (a chunked frame learning the
            figures of every codec at once); empty otherwise.
    """

    codec: int | None
    probe: int | None = None
    learn: tuple[int, ...] = ()


@dataclass
class _Figures:
    bps: float | None = None  # raw bytes per second of one compressor call
    ratio: float | None = None  # raw / wire


class LinkAdvisor:
    """Raw or which codec for one sending direction, decided from its own traffic.

    Args:
        codec_ids: The codecs to choose from besides raw (wire ids).
        threads: Compressor threads that can work on one frame's chunks at once.
        probe_every: Every this many frames, what is not in use is measured again.
        decoders: The receiver's decoder threads until its first record says.
    """

    def __init__(
        self,
        codec_ids: tuple[int, ...],
        threads: int = 1,
        probe_every: int = 8,
        decoders: int = 1,
    ) -> None:
        self._lock = threading.Lock()
        self.decode = DecodeFigures(decoders, EWMA)  # the receiver's decode rates
        self._ids = codec_ids
        self._threads = max(1, threads)
        self._probe_every = max(2, probe_every)
        self.link_bps: float | None = None  # delivered bytes per second
        self._link_samples = 0
        self.emulated_bps: float | None = None  # the emulated link's bandwidth, if any
        self.transport: str | None = None  # the link's transport, from its first frame
        self._figures: dict[tuple[int, str], _Figures] = {}
        self.choice: int | None = None  # the codec in use, None: raw
        self.reason = "learning the link"
        self.dtype = ""
        self._frames = 0
        self._turned = 1  # the decided frame that turned to the codec in use
        self._learned = False  # the last frame decided was a learning frame
        self._turn = 0
        self.switches = 0
        self.confirms = 0  # raw-to-codec turns of a real link held for a confirming raw frame
        self._pending: tuple[int, str] | None = None  # (codec, data class) being confirmed
        self._predicted: dict[str, float] = {}

    @property
    def memory_link(self) -> bool:
        """Whether the link is shared memory without emulation (always raw, nothing probed)."""
        return self.transport == MEMORY_LINK and self.emulated_bps is None

    def observe_link(
        self,
        nbytes: int,
        seconds: float,
        emulated_bps: float | None,
        raw: bool = True,
        transport: str | None = None,
    ) -> None:
        """A frame's wire bytes took ``seconds`` on the link (sends and pacing).

        Only raw frames (``raw``) update the delivered rate. ``transport`` names the link
        (``"shm"``, ``"gloo"``; None: unknown).
        """
        with self._lock:
            self.emulated_bps = emulated_bps
            if transport is not None:
                self.transport = transport
            if raw and nbytes >= MIN_OBSERVED_BYTES and seconds > 0:
                sample = nbytes / seconds
                self.link_bps = max(sample, _blend(self.link_bps, sample))
                self._link_samples += 1

    def observe_codec(self, codec_id: int, dtype: str, raw: int, wire: int, seconds: float) -> None:
        """Compressing ``raw`` bytes of ``dtype`` gave ``wire`` bytes in ``seconds`` (one call)."""
        if raw < MIN_OBSERVED_BYTES or seconds <= 0 or wire <= 0:
            return
        with self._lock:
            fig = self._figures.setdefault((codec_id, dtype), _Figures())
            fig.bps = _blend(fig.bps, raw / seconds)
            fig.ratio = _blend(fig.ratio, raw / wire)

    def observe_decode(self, codec_id: int, dtype: str, raw: int, seconds: float) -> None:
        """This side decoded ``raw`` bytes of its own probe in ``seconds`` (one call)."""
        if raw >= MIN_OBSERVED_BYTES:
            self.decode.observe_probe(codec_id, dtype, raw, seconds)

    def observe_feedback(self, record: bytes, peer: str = "the receiver") -> bool:
        """A decode record the receiver sent back; False (logged) when it is ignored."""
        return self.decode.observe_record(record, peer)

    def sending(self, seq: int, dtype: str) -> None:
        """Frame ``seq`` of data class ``dtype`` goes on the wire (its records name it)."""
        self.decode.remember(seq, dtype)

    def decide(self, dtype: str, chunked: bool) -> Choice:
        """How the next frame goes, whose data class is ``dtype``.

        Args:
            dtype: The data class the figures are looked up by (``"int64"``, or with the
                sample's ratio class, ``"int64:c3"``).
            chunked: Whether the frame is large enough to be sent in chunks.
        """
        with self._lock:
            if self.memory_link:  # (the data is not looked at: ``dtype`` may be "")
                self._set(None, MEMORY_REASON)
                return Choice(None)
            self.dtype = dtype
            link = self.emulated_bps
            if link is None and self._link_samples >= LINK_SAMPLES:
                link = self.link_bps
            if link is None:
                self._set(None, "learning the link")
                return Choice(None)
            unknown = []
            for cid in self._ids:
                fig = self._figures.get((cid, dtype))
                if fig is None or fig.bps is None:
                    unknown.append(cid)
            if unknown:  # a chunked frame learns every codec at once, chunk by chunk
                learn = tuple(unknown) if chunked else (unknown[0],)
                names = " and ".join(CODEC_NAMES[c] for c in learn)
                self._set(learn[0], f"learning {names} on {dtype}")
                self._learned = True
                return Choice(learn[0], learn=learn if chunked else ())
            best, reason = self._judge(link, dtype, chunked)
            self._frames += 1
            if self._confirm(best, dtype, reason):
                return Choice(None, probe=best if chunked else None)
            if best is not None and (best != self.choice or self._learned):
                self._turned = self._frames  # a turn to this codec (or it was just learned)
            self._learned = False
            self._set(best, reason)
            k = self._frames % self._probe_every
            real = best is not None and self.emulated_bps is None
            if real and (k == 0 or self._frames - self._turned + 1 in EARLY_REFRESH):
                return Choice(None)  # a raw frame refreshes a real link's rate
            others = [c for c in self._ids if c != best]
            if others and (k == 0 or (real and k == self._probe_every // 2)):
                self._turn += 1
                return Choice(best, probe=others[self._turn % len(others)])
            return Choice(best)

    def _confirm(self, best: int | None, dtype: str, reason: str) -> bool:
        """Whether a real link turning from raw to ``best`` sends one more raw frame first.

        On a real link (not emulated) the delivered rate comes from raw frames timed on
        this host: a few frames slowed by a busy CPU (the peer's receive, another
        process) make a fast link look slow next to codec figures measured earlier, and
        a wrong turn costs every frame up to the next raw refresh a compression and a
        decoding pass. So the first judgment for a codec sends the frame raw (a fresh
        link sample; a fast one lifts the rate at once) with the codec probed aside on
        a chunked frame (its figures under the present load); the turn happens when the
        next frame of that data class is still judged so. Emulated links, a codec
        already in use and learning frames turn at once.
        """
        if best is None or self.choice is not None or self.emulated_bps is not None:
            if self._pending is not None and self._pending[1] == dtype:
                self._pending = None  # (another class's frames in between leave it)
            return False
        if self._pending == (best, dtype):
            self._pending = None
            return False
        self._pending = (best, dtype)
        self.confirms += 1
        name = CODEC_NAMES[best]
        self._set(None, f"raw: confirming {name} on a fresh raw frame; {reason}")
        return True

    def _set(self, codec: int | None, reason: str) -> None:
        if codec != self.choice:
            self.switches += 1
        self.choice, self.reason = codec, reason

    def _seconds(self, cid: int, dtype: str, link: float, chunked: bool) -> float | None:
        """Predicted seconds per raw byte with codec ``cid``; None if it does not shrink."""
        fig = self._figures[(cid, dtype)]
        assert fig.bps is not None
        assert fig.ratio is not None
        if fig.ratio < MIN_RATIO:
            return None
        codec, wire = 1 / fig.bps, 1 / (fig.ratio * link)
        decode = 1 / self._decode_bps(cid, dtype, fig.bps, chunked)
        if chunked:
            return max(codec / self._threads, wire, decode)
        return codec + wire + decode

    def _decode_bps(self, cid: int, dtype: str, compress_bps: float, chunked: bool) -> float:
        """The receiver's decoding pace (raw bytes per second) of codec ``cid`` on ``dtype``.

        Measured (one call's rate, times the receiver's decoder threads for a chunked
        frame) once a figure is in; until then the default ratio to compressing.
        """
        bps, _ = self.decode.rate(cid, dtype)
        if bps is not None:
            return bps * (self.decode.decoders if chunked else 1)
        speedup = DECODE_SPEEDUP.get(cid, 2.0)
        if dtype.endswith(SHUFFLED):
            speedup = SHUFFLED_DECODE_SPEEDUP.get(cid, speedup)
        return speedup * compress_bps

    def _judge(self, link: float, dtype: str, chunked: bool) -> tuple[int | None, str]:
        raw = 1 / link
        times = {cid: self._seconds(cid, dtype, link, chunked) for cid in self._ids}
        self._predicted = {"raw": 1 / raw} | {
            CODEC_NAMES[c]: 1 / t for c, t in times.items() if t is not None
        }
        shrink = {c: t for c, t in times.items() if t is not None}
        figures = self._summary(link, dtype)
        if not shrink:
            return None, f"raw: the data does not shrink ({figures})"
        best = min(shrink, key=lambda c: shrink[c])
        current = self.choice
        if current in shrink and shrink[current] <= HYSTERESIS * shrink[best]:
            best = current  # near-tie: keep what is in use
        if shrink[best] * MARGIN > raw:
            return None, f"raw: the link is faster than the codecs ({figures})"
        return best, f"{CODEC_NAMES[best]}: the fastest way on this link ({figures})"

    def _summary(self, link: float, dtype: str) -> str:
        parts = [f"link {link * 8 / 1e6:.0f} Mbit/s"]
        for cid in self._ids:
            fig = self._figures[(cid, dtype)]
            assert fig.bps is not None
            assert fig.ratio is not None
            bps, source = self.decode.rate(cid, dtype)
            decode = "default" if bps is None else f"{bps * 8 / 1e6:.0f} Mbit/s ({source})"
            parts.append(
                f"{CODEC_NAMES[cid]} {fig.bps * 8 / 1e6:.0f} Mbit/s x{self._threads}"
                f" ratio {fig.ratio:.2f} decode {decode}"
            )
        pred = ", ".join(f"{k} {v * 8 / 1e6:.0f}" for k, v in self._predicted.items())
        return "; ".join(parts) + f" on {dtype}; predicted Mbit/s of raw data: {pred}"

    def as_dict(self) -> dict[str, object]:
        """The decision, its reason and the figures behind it (for ``stats()``).

        Returns:
            ``decision`` (``"raw"`` or the codec's name), ``reason``, ``switches`` (changes
            of decision), ``confirms`` (turns from raw to a codec on a real link held
            for a confirming raw frame), ``dtype`` (of the last frame decided),
            ``transport``, ``link_mbps`` (delivered, from raw frames), ``emulated_mbps``,
            ``predicted_mbps`` (raw data per second each way, for the last frame's dtype)
            and ``codecs``: per codec
            name and dtype, ``mbps`` (one compressor call), ``ratio``, ``decode_mbps``
            (one decode call at the receiver; None before any figure), ``decode_source``
            (``receiver``: its records; ``probe``: this side decoded a probe aside;
            ``default``: none yet, :data:`DECODE_SPEEDUP` is used) and ``decode_samples``
            (per source). ``decode_feedback``: the receiver's ``records`` taken,
            ``ignored`` (garbled, or for a frame not known) and its ``decoders``.
        """
        with self._lock:
            codecs: dict[str, dict[str, dict[str, object]]] = {}
            for (cid, dtype), fig in sorted(self._figures.items()):
                codecs.setdefault(CODEC_NAMES[cid], {})[dtype] = {
                    "mbps": None if fig.bps is None else fig.bps * 8 / 1e6,
                    "ratio": fig.ratio,
                    **self.decode.as_dict(cid, dtype),
                }
            return {
                "decision": "raw" if self.choice is None else CODEC_NAMES[self.choice],
                "reason": self.reason,
                "switches": self.switches,
                "confirms": self.confirms,
                "dtype": self.dtype,
                "transport": self.transport,
                "link_mbps": None if self.link_bps is None else self.link_bps * 8 / 1e6,
                "emulated_mbps": (
                    None if self.emulated_bps is None else self.emulated_bps * 8 / 1e6
                ),
                "predicted_mbps": {k: v * 8 / 1e6 for k, v in self._predicted.items()},
                "codecs": codecs,
                "decode_feedback": {
                    "records": self.decode.records,
                    "ignored": self.decode.ignored,
                    "decoders": self.decode.decoders,
                },
            }
