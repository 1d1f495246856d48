"""Peer-process tasks of the decode-feedback tests (see ``wire_tasks`` for the conventions)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
from collective_tasks import PeerContext
from wire_tasks import KiB, close, group, token_ids

GARBLED = "garbled"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _wait_for(cond: Any, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return bool(cond())


def t_send_ids(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int, ignored: int
) -> dict[str, Any]:
    """Send ``n`` 512 KiB token-id tensors; once the peer is done, take the advisor's figures.

    Waits (bounded) until the receiver's decode records arrived (and ``ignored`` garbled
    ones were refused), then asks the advisor, with its real figures, to judge an
    emulated link whose rate lies between what the default decode factor and the
    measured decode rate predict (see the test).
    """
    from p2p_collective._compression._adaptive import MARGIN, SHUFFLED_DECODE_SPEEDUP

    lines = _Lines()
    log = logging.getLogger("p2p_collective")
    log.addHandler(lines)
    try:
        g = group(ctx, tag, cluster)
        for k in range(n):
            g.send(token_ids(512 * KiB, seed=k), timeout=60)
        assert g.recv(timeout=60) == "done"
        advisor = g._send.wire_stats.advisor
        assert advisor is not None

        def arrived() -> bool:
            fb = advisor.as_dict()["decode_feedback"]
            return bool(fb["records"] >= 1 and fb["ignored"] >= ignored)

        ok = _wait_for(arrived)
        time.sleep(0.1)  # (nothing more is on its way: the peer sent "done" after its last)
        stats = g.stats()["send"]
        adaptive = stats["adaptive"]
        data = adaptive["dtype"]
        lz4 = adaptive["codecs"]["lz4"][data]
        # one compressor thread (the config): compressing delivers lz4["mbps"]; decoding
        # by default SHUFFLED_DECODE_SPEEDUP x that, measured: decode_mbps x decoders
        old = min(lz4["mbps"], SHUFFLED_DECODE_SPEEDUP[1] * lz4["mbps"])
        new = min(lz4["mbps"], lz4["decode_mbps"] * adaptive["decode_feedback"]["decoders"])
        link_mbps = (old + new) / 2 / MARGIN  # raw beats the lower, not the higher
        advisor.observe_link(1 << 20, 1.0, link_mbps * 1e6 / 8, transport=None)
        choice = advisor.decide(data, True)
        judged = advisor.as_dict()
        g.send("bye", timeout=60)
        return {
            "arrived": ok,
            "stats": stats,
            "old": old,
            "new": new,
            "link_mbps": link_mbps,
            "choice": choice.codec,
            "judged": judged,
            "lines": lines.lines,
            "broken": g.stats()["send"]["broken"],
        }
    finally:
        log.removeHandler(lines)
        close(tag)


def _garble(g: Any) -> int:
    """Write bad feedback on the direction's liveness connection; return how many records."""
    from p2p_collective._compression._decode_rates import pack_record

    link = g._recv.link
    assert link is not None
    bad = [
        pack_record(9, 1, False, 1, 1, 1 << 20, 0.001),  # no codec has id 9
        pack_record(1, 1, True, 1, 1, 1 << 20, math.nan),  # NaN seconds
        pack_record(1, 1, True, 1, 10**12, 1 << 20, 0.001),  # a frame never sent
    ]
    for record in bad:
        assert link.send_record(record)
    gloo = getattr(link, "_gloo", link)  # the shared-memory link keeps its gloo link's socket
    gloo._watch.send(b"xyz")  # bytes that start no record at all
    return len(bad)


def t_recv_ids(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int, garble_after: int
) -> dict[str, Any]:
    """Receive what :func:`t_send_ids` sends; after frame ``garble_after`` (1-based), garble."""
    g = group(ctx, tag, cluster)
    ok = True
    for k in range(n):
        ok = ok and bool(torch.equal(g.recv(timeout=60), token_ids(512 * KiB, seed=k)))
        if k + 1 == garble_after:
            _garble(g)
    g.send("done", timeout=60)
    assert g.recv(timeout=60) == "bye"
    stats = g.stats()["recv"]
    close(tag)
    return {"ok": ok, "stats": stats}
