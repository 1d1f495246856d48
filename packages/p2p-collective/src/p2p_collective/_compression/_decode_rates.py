"""Decode rates: measured by the receiver and sent back to the sender's link advisor.

An adaptive sender (:class:`~p2p_collective._compression._adaptive.LinkAdvisor`) predicts
a compressed frame's pace from the slowest of compressing, the wire and *decoding* --
and decoding happens in another process, often on another host. So the receiver
measures it: each compressed chunk (or tensor) is decoded by one call on a decoder
thread, timed in wall time (a busy receiver shows as a slower decoder), and per frame
and codec the raw bytes and seconds are summed. At most one record per codec every
:data:`REPORT_INTERVAL` seconds goes back to the sender (:class:`DecodeReporter`).

The path back is the direction's **liveness connection**
(:mod:`p2p_collective._links._liveness`): a plain TCP connection between the same two
processes that every direction already holds and the watcher thread on the sender
already reads (today only for a goodbye and end-of-file). A record is 40 bytes,
written without blocking by the receiving direction thread once a frame's decodes
ended; the sender's watcher thread hands it to the advisor. Considered and not taken:

* the rendezvous store (a key per direction the receiver sets, the sender reads every
  ``probe_every`` frames): every report and every read is a blocking round trip to the
  job's one store server (a cross-node hop for most pairs, and a ``TCPStore`` client
  serializes its requests, see :func:`~p2p_collective._peers._rendezvous.private_client`),
  one of them on the sender's send path, and the sender sees a figure only when it polls;
* the sender decoding its own probe aside and timing that: a measured figure, but of
  the sender's CPUs, and of a 256 KiB piece decoded on an idle direction thread rather
  than of the receiver's decoder thread keeping up with a stream. It is kept as a
  refresher (source ``probe``): while a link sends raw the receiver decodes nothing,
  so without it a decode figure would never change again.

The record (:data:`RECORD`, little endian)::

    tag      c   b"D"
    codec    u8  the wire codec id (1 lz4, 2 zstd, 3 sparse)
    decoders u8  the receiver's decoder threads (chunks of one frame decode in parallel)
    flags    u8  bit 0: the chunks were byte-shuffled (the unshuffle is included)
    chunks   u32 the decode calls summed
    seq      u64 the frame's sequence number in its direction
    raw      u64 raw bytes decoded
    seconds  f64 wall seconds of those calls, summed
    end      c   a newline byte

The sender knows each frame's data class by its sequence number
(:class:`DecodeFigures`), so a record lands on the figures of the class it measured. A
record that does not parse, names a codec or frame the sender does not know, or holds
impossible numbers is logged and ignored: the link goes on as before.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from p2p_collective._links._liveness import RECORD_BYTES
from p2p_compress.internal import CODEC_NAMES, CODEC_RAW

_log = logging.getLogger("p2p_collective")

RECORD: Final = struct.Struct("<cBBBxIQQd6xc")
"""One decode record (see the module docstring); :data:`RECORD_BYTES` long."""
assert RECORD.size == RECORD_BYTES
TAG: Final = b"D"
END: Final = b"\n"
SHUFFLED_FLAG: Final = 0x01
REPORT_INTERVAL: Final = 0.02
"""Seconds between two records of one codec from one receiving direction (at most)."""
MIN_REPORT_BYTES: Final = 64 * 1024
"""A frame's decodes of one codec below this many raw bytes are not reported."""
KNOWN_FRAMES: Final = 256
"""Frames whose data class a sender remembers for records still on their way."""

SOURCES: Final = ("receiver", "probe")
"""Where a decode figure comes from: the receiver's records, or the sender's own probe."""


@dataclass(frozen=True)
class DecodeSample:
    """One parsed decode record."""

    codec_id: int
    decoders: int
    shuffled: bool
    chunks: int
    seq: int
    raw: int
    seconds: float


def pack_record(
    codec_id: int, decoders: int, shuffled: bool, chunks: int, seq: int, raw: int, seconds: float
) -> bytes:
    """The bytes of one decode record."""
    flags = SHUFFLED_FLAG if shuffled else 0
    return RECORD.pack(TAG, codec_id, min(decoders, 255), flags, chunks, seq, raw, seconds, END)


def parse_record(record: bytes) -> DecodeSample:
    """Parse and check one decode record.

    Raises:
        ValueError: It is not one: wrong size or tag, an unknown codec id, no decoder
            threads, no bytes or calls, or seconds that are not a positive finite number.
    """
    if len(record) != RECORD.size:
        raise ValueError(f"a decode record is {RECORD.size} bytes, got {len(record)}")
    tag, codec_id, decoders, flags, chunks, seq, raw, seconds, end = RECORD.unpack(record)
    if tag != TAG or end != END:
        raise ValueError(f"a decode record runs from {TAG!r} to {END!r}, got {tag!r}..{end!r}")
    if codec_id == CODEC_RAW or codec_id not in CODEC_NAMES:
        raise ValueError(f"a decode record names codec id {codec_id}, not a known codec")
    if decoders < 1 or chunks < 1 or raw < 1:
        raise ValueError(
            f"a decode record of {decoders} decoder threads, {chunks} calls and {raw} bytes"
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"a decode record of {seconds!r} seconds")
    return DecodeSample(codec_id, decoders, bool(flags & SHUFFLED_FLAG), chunks, seq, raw, seconds)


class FrameDecodes:
    """The decodes of one received frame, summed per codec (a direction thread's own)."""

    __slots__ = ("per_codec",)

    def __init__(self) -> None:
        self.per_codec: dict[int, list[Any]] = {}  # codec id -> [raw, seconds, calls, shuffled]

    def add(self, codec_id: int, raw: int, seconds: float, shuffled: bool = False) -> None:
        """One decode call of ``raw`` bytes took ``seconds``."""
        entry = self.per_codec.setdefault(codec_id, [0, 0.0, 0, False])
        entry[0] += raw
        entry[1] += seconds
        entry[2] += 1
        entry[3] = entry[3] or shuffled


class DecodeReporter:
    """The receiving side: sends a frame's decode figures back, at most one per interval.

    Args:
        send: Writes one record to the sender without blocking; False: dropped.
        decoders: This side's decoder threads.
    """

    def __init__(self, send: Callable[[bytes], bool], decoders: int) -> None:
        self._send = send
        self._decoders = max(1, decoders)
        self._last: dict[int, float] = {}
        self.sent = 0
        self.dropped = 0

    def report(self, seq: int, decodes: FrameDecodes) -> None:
        """Report frame ``seq``'s decodes (per codec: when its last report is old enough)."""
        now = time.monotonic()
        for codec_id, (raw, seconds, calls, shuffled) in decodes.per_codec.items():
            if raw < MIN_REPORT_BYTES or seconds <= 0:
                continue
            if now - self._last.get(codec_id, -math.inf) < REPORT_INTERVAL:
                continue
            self._last[codec_id] = now
            record = pack_record(codec_id, self._decoders, shuffled, calls, seq, raw, seconds)
            if self._send(record):
                self.sent += 1
            else:
                self.dropped += 1


@dataclass
class _Rate:
    bps: float | None = None  # raw bytes per second of one decode call
    source: str = "default"
    samples: dict[str, int] | None = None


class DecodeFigures:
    """The sending side: per codec and data class, how fast the receiver decodes.

    Fed by the receiver's records (:meth:`observe_record`, from the liveness watcher
    thread) and by the sender's own probes (:meth:`observe_probe`) into one running
    estimate per codec and data class: a sample faster than the estimate replaces it, a
    slower one is blended in (weight ``ewma``), as the link's delivered rate is. Wall
    time only ever shows a decoder slower than it can go (a cold first frame, a core
    shared with the compressors of a learning frame: measured 274 MB/s a call for lz4
    on shuffled token ids where the same receiver decoded 1.4-1.5 GB/s a call frame after
    frame), and the errors are not alike: a figure too high makes the link compress,
    and every compressed frame's record then brings it down within a few frames; a
    figure too low keeps the link raw, where the receiver decodes nothing and reports
    nothing, so only the sender's probes, one codec every ``probe_every`` frames, could
    ever raise it.

    Args:
        decoders: The receiver's decoder threads until a record says otherwise.
        ewma: The weight of a new sample.
    """

    def __init__(self, decoders: int, ewma: float) -> None:
        self._lock = threading.Lock()
        self._ewma = ewma
        self.decoders = max(1, decoders)
        self._rates: dict[tuple[int, str], _Rate] = {}
        self._frames: OrderedDict[int, str] = OrderedDict()
        self.records = 0
        self.ignored = 0

    def remember(self, seq: int, dtype: str) -> None:
        """Frame ``seq`` (compressed, of data class ``dtype``) went on the wire."""
        with self._lock:
            self._frames[seq] = dtype
            while len(self._frames) > KNOWN_FRAMES:
                self._frames.popitem(last=False)

    def _blend(self, codec_id: int, dtype: str, bps: float, source: str) -> None:
        rate = self._rates.setdefault((codec_id, dtype), _Rate(samples=dict.fromkeys(SOURCES, 0)))
        if rate.bps is None:
            rate.bps = bps
        else:  # a faster sample counts at once, a slower one is blended in
            rate.bps = max(bps, (1 - self._ewma) * rate.bps + self._ewma * bps)
        rate.source = source
        assert rate.samples is not None
        rate.samples[source] += 1

    def observe_record(self, record: bytes, peer: str = "the receiver") -> bool:
        """A record the receiver sent back; False (logged) when it is ignored."""
        try:
            sample = parse_record(record)
        except ValueError as exc:
            with self._lock:
                self.ignored += 1
            _log.warning("decode feedback from %s ignored: %s (%s)", peer, exc, record.hex())
            return False
        with self._lock:
            dtype = self._frames.get(sample.seq)
            if dtype is None:
                self.ignored += 1
                _log.warning(
                    "decode feedback from %s ignored: frame %d is not one of the last %d"
                    " frames sent",
                    peer,
                    sample.seq,
                    KNOWN_FRAMES,
                )
                return False
            self.records += 1
            self.decoders = sample.decoders
            self._blend(sample.codec_id, dtype, sample.raw / sample.seconds, "receiver")
        return True

    def observe_probe(self, codec_id: int, dtype: str, raw: int, seconds: float) -> None:
        """The sender decoded ``raw`` bytes of its own probe in ``seconds`` (one call)."""
        if raw < 1 or seconds <= 0:
            return
        with self._lock:
            self._blend(codec_id, dtype, raw / seconds, "probe")

    def rate(self, codec_id: int, dtype: str) -> tuple[float | None, str]:
        """One decode call's raw bytes per second and where it came from (None: not yet)."""
        with self._lock:
            rate = self._rates.get((codec_id, dtype))
            if rate is None:
                return None, "default"
            return rate.bps, rate.source

    def as_dict(self, codec_id: int, dtype: str) -> dict[str, object]:
        """``decode_mbps`` (one call), ``decode_source`` and ``decode_samples`` per source."""
        with self._lock:
            rate = self._rates.get((codec_id, dtype))
            if rate is None:
                return {
                    "decode_mbps": None,
                    "decode_source": "default",
                    "decode_samples": dict.fromkeys(SOURCES, 0),
                }
            return {
                "decode_mbps": None if rate.bps is None else rate.bps * 8 / 1e6,
                "decode_source": rate.source,
                "decode_samples": dict(rate.samples or {}),
            }
