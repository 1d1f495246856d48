"""Adaptive compression per link: send compressed only where it pays, learned from traffic.

With ``compression_pipeline.adaptive: true`` each sending direction (one link) keeps a
:class:`LinkAdvisor`. It learns, from the frames it sends:

* the link's delivered rate: bytes over the time spent putting them on the link (the
  transport's send calls and, on an emulated link, pacing), from frames sent raw only
  (a compressed stream is slowed by the receiver's decoding, which is not the link);
  an emulated link is judged by its emulated bandwidth instead, which is what it
  stands for;
* the codec's throughput (raw bytes per second of compressing, per compressor thread,
  times the threads that compress chunks in parallel) and its ratio on this link's data.

A frame goes compressed when the codec keeps ahead of the link and shrinks the data:
``ratio >= MIN_RATIO`` and ``codec rate >= MARGIN * link rate`` (with chunked frames the
codec and the wire overlap, so the slower of the two sets the pace). Otherwise its
eligible tensors go raw with the reason ``adaptive``. The first frame goes raw (learning
the link), the next compressed (learning the codec). Every ``PROBE_EVERY``-th frame
probes the other way: while sending raw, one chunk (or a frame too small for chunks) is
compressed to refresh the codec's figures; while compressing over a real (not emulated)
link, one frame goes raw to refresh the link's rate. So a change of data or link is
noticed both ways. The decision and its reason are in ``stats()``.
"""

from __future__ import annotations

import threading
from typing import Any, Final

EWMA: Final = 0.3
"""Weight of a new observation in the running estimates."""
MIN_RATIO: Final = 1.1
MARGIN: Final = 1.2
PROBE_EVERY: Final = 8
MIN_OBSERVED_BYTES: Final = 64 * 1024
"""Sends smaller than this say little about a link's rate (latency dominates)."""


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


class LinkAdvisor:
    """Raw or compressed for one sending direction, decided from its own traffic.

    Args:
        threads: Compressor threads that can work on one frame's chunks at once.
    """

    def __init__(self, threads: int = 1) -> None:
        self._lock = threading.Lock()
        self._threads = max(1, threads)
        self.link_bps: float | None = None  # delivered bytes per second
        self.emulated_bps: float | None = None  # the emulated link's bandwidth, if any
        self.codec_bps: float | None = None  # raw bytes per second, one thread
        self.ratio: float | None = None  # raw / wire
        self.compress = False
        self.reason = "learning the link"
        self._frames = 0
        self.switches = 0

    def observe_link(
        self, nbytes: int, seconds: float, emulated_bps: float | None, raw: bool = True
    ) -> None:
        """A frame's wire bytes took ``seconds`` on the link (sends and pacing).

        Only raw frames (``raw``) update the delivered rate.
        """
        with self._lock:
            self.emulated_bps = emulated_bps
            if raw and nbytes >= MIN_OBSERVED_BYTES and seconds > 0:
                self.link_bps = _blend(self.link_bps, nbytes / seconds)

    def observe_codec(self, raw: int, wire: int, seconds: float) -> None:
        """Compressing ``raw`` bytes gave ``wire`` bytes in ``seconds`` (one thread)."""
        if raw < MIN_OBSERVED_BYTES or seconds <= 0 or wire <= 0:
            return
        with self._lock:
            self.codec_bps = _blend(self.codec_bps, raw / seconds)
            self.ratio = _blend(self.ratio, raw / wire)

    def decide(self) -> str:
        """How the next frame with eligible tensors goes.

        Returns:
            ``"compress"``, ``"raw"``, ``"probe_codec"`` (mostly raw, but compress a
            little to refresh the codec's figures) or ``"probe_link"`` (raw, to refresh
            the link's rate).
        """
        with self._lock:
            compress, reason = self._judge()
            if compress != self.compress:
                self.switches += 1
                self._frames = 0
            self.compress, self.reason = compress, reason
            self._frames += 1
            probe = self._frames % PROBE_EVERY == 0
            if compress:
                if self.link_bps is None and self.emulated_bps is None:
                    return "probe_link"
                if probe and self.emulated_bps is None:
                    return "probe_link"
                return "compress"
            if self.link_bps is None and self.emulated_bps is None:
                return "probe_link"
            if self.codec_bps is None or probe:
                return "probe_codec"
            return "raw"

    def _judge(self) -> tuple[bool, str]:
        link = self.emulated_bps if self.emulated_bps is not None else self.link_bps
        if link is None:
            return False, "learning the link"
        if self.codec_bps is None or self.ratio is None:
            return True, "learning the codec"
        codec = self.codec_bps * self._threads
        figures = (
            f"link {link * 8 / 1e6:.0f} Mbit/s, codec {codec * 8 / 1e6:.0f} Mbit/s,"
            f" ratio {self.ratio:.2f}"
        )
        if self.ratio < MIN_RATIO:
            return False, f"raw: the data does not shrink ({figures})"
        if codec < MARGIN * link:
            return False, f"raw: the link is faster than the codec ({figures})"
        return True, f"compressed: the codec keeps ahead of the link ({figures})"

    def as_dict(self) -> dict[str, Any]:
        """The decision, its reason and the figures behind it (for ``stats()``)."""
        with self._lock:
            return {
                "decision": "compressed" if self.compress else "raw",
                "reason": self.reason,
                "switches": self.switches,
                "link_mbps": None if self.link_bps is None else self.link_bps * 8 / 1e6,
                "emulated_mbps": (
                    None if self.emulated_bps is None else self.emulated_bps * 8 / 1e6
                ),
                "codec_mbps": None if self.codec_bps is None else self.codec_bps * 8 / 1e6,
                "ratio": self.ratio,
            }
