"""One side of the soak (runs in a spawned process): senders, receivers, checks, RSS samples."""

from __future__ import annotations

import dataclasses
import datetime
import os
import threading
import time
import traceback
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

ROLES = ("left", "right")
BIG_EVERY = 101  # every 101st message of a stream is a 1 MiB tensor


@dataclasses.dataclass
class Item:
    """The dataclass kind of soak message."""

    tokens: torch.Tensor
    step: int
    note: str


def make_message(g: int, d: int, s: int) -> Any:
    """Message ``s`` of group ``g``, direction ``d``: deterministic, of a kind set by ``s``."""
    meta = torch.tensor([g, d, s], dtype=torch.int64)
    if s % BIG_EVERY == BIG_EVERY - 1:
        big = torch.arange(131072, dtype=torch.int64) % 251
        big[0] = s
        return big
    kind = s % 6
    if kind == 0:
        return {"g": g, "d": d, "s": s, "note": "small object", "vals": [s, s * 2, s * 3]}
    if kind == 1:
        ids = (torch.arange(8192, dtype=torch.int64) * 7 + s) % 1000
        ids[0], ids[1] = s, 2 * g + d
        return ids
    if kind == 2:
        return [meta, torch.arange(256, dtype=torch.float32) * 0.5 + s]
    if kind == 3:
        return {
            "meta": meta,
            "ids": torch.arange(8192, dtype=torch.int32) % 50,
            "mask": torch.arange(1000) % 3 == 0,
        }
    if kind == 4:
        return Item((torch.arange(4096, dtype=torch.int64) % 97) + s, s, f"g{g}d{d}")
    return (meta, (torch.arange(8192) % 64).to(torch.bfloat16))


def sequence_of(obj: Any) -> int:
    """The sequence number a received message carries."""
    if isinstance(obj, dict):
        return int(obj["s"]) if "s" in obj else int(obj["meta"][2])
    if isinstance(obj, torch.Tensor):
        return int(obj[0])
    if isinstance(obj, Item):
        return obj.step
    return int(obj[0][2])  # list or tuple led by the meta tensor


def same(a: Any, b: Any) -> bool:
    """Deep equality with types, dtypes and shapes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Item):
        return same(a.tokens, b.tokens) and (a.step, a.note) == (b.step, b.note)
    return bool(a == b)


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_config(sections: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The CollectiveConfig with compression and emulation where this version accepts them."""
    from p2p_collective import CollectiveConfig, parse_collective_config, parse_net_emulation

    notes: dict[str, str] = {}
    section = dict(sections["collective"])
    try:
        cfg = parse_collective_config(section)
        comp = cfg.compression
        notes["compression"] = "off" if comp is None else str(comp.codec_name)
    except Exception as exc:
        section.pop("tensor_compression", None)
        cfg = parse_collective_config(section)
        notes["compression"] = f"not accepted ({exc})"
    if sections["net_emulation"] is None:
        notes["emulation"] = "off"
    else:
        try:
            emu = parse_net_emulation(sections["net_emulation"])
            cfg = dataclasses.replace(cfg, net_emulation=emu)
            notes["emulation"] = repr(emu)
        except Exception as exc:
            notes["emulation"] = f"not accepted ({exc})"
    assert isinstance(cfg, CollectiveConfig)
    return cfg, notes


class Side:
    """State and threads of one process of the soak."""

    def __init__(self, role: str, port: int, args: dict[str, Any], cfg: Any) -> None:
        from p2p_collective import Collective

        self.role = role
        self.d = ROLES.index(role)  # direction this side sends in
        self.args = args
        self.store = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=120)
        )
        self.coll = Collective(role, self.store, config=cfg)
        self.groups = [
            self.coll.create_collective_group(list(ROLES), group_name=f"soak{k}")
            for k in range(args["groups"])
        ]
        self.per_stream = args["messages"] // (2 * args["groups"])
        self.lock = threading.Lock()
        self.sent = self.received = self.reordered = self.corrupt = self.lost = 0
        self.errors: list[str] = []
        self.rss: list[tuple[float, int]] = []
        self.warm_after = float("inf")
        self.t0 = time.monotonic()
        minutes = args["minutes"]
        self.stop_at = None if minutes is None else self.t0 + 60.0 * minutes
        self._unreported = 0
        self.done = threading.Event()

    def error(self, where: str) -> None:
        """Record the exception being handled."""
        with self.lock:
            self.errors.append(f"{self.role} {where}: {traceback.format_exc(limit=3)}")

    def sender(self, k: int) -> None:
        """Send this direction's stream of group ``k``, then its end marker."""
        g, window, count = self.groups[k], self.args["window"], 0
        inflight: deque[Any] = deque()
        try:
            for s in range(self.per_stream):
                if self.stop_at is not None and time.monotonic() > self.stop_at:
                    break
                inflight.append(g.send(make_message(k, self.d, s), async_op=True))
                count += 1
                if len(inflight) >= window:
                    inflight.popleft().wait(timeout=600)
            inflight.append(g.send({"end": count}, async_op=True))
            while inflight:
                inflight.popleft().wait(timeout=600)
        except Exception:
            self.error(f"sender {k}")
        with self.lock:
            self.sent += count

    def receiver(self, k: int) -> None:
        """Receive and check the peer's stream of group ``k`` up to its end marker."""
        g, window, peer_d = self.groups[k], self.args["window"], 1 - self.d
        posted: deque[Any] = deque(g.recv(async_op=True) for _ in range(window))
        expected = got = 0
        try:
            while True:
                obj = posted.popleft().wait(timeout=600)
                if isinstance(obj, dict) and set(obj) == {"end"}:
                    with self.lock:
                        self.lost += obj["end"] - got
                    break
                posted.append(g.recv(async_op=True))
                s = sequence_of(obj)
                reordered, corrupt = s != expected, not same(obj, make_message(k, peer_d, s))
                expected, got = s + 1, got + 1
                self.count_received(reordered, corrupt)
        except Exception:
            self.error(f"receiver {k}")

    def count_received(self, reordered: bool, corrupt: bool) -> None:
        """Count one received message; report progress to the store every 1000."""
        with self.lock:
            self.received += 1
            self.reordered += reordered
            self.corrupt += corrupt
            self._unreported += 1
            if self.received >= 0.1 * self.per_stream * len(self.groups) and self.rss:
                self.warm_after = min(self.warm_after, time.monotonic() - self.t0)
            report, self._unreported = (
                (self._unreported, 0) if self._unreported >= 1000 else (0, self._unreported)
            )
        if report:
            self.store.add(f"soak/received/{self.role}", report)

    def sampler(self) -> None:
        """Sample this process's RSS until the run is done."""
        period = self.args["sample_seconds"]
        while not self.done.wait(period):
            self.rss.append((time.monotonic() - self.t0, rss_bytes()))

    def run(self) -> float:
        """Run every sender and receiver; return the seconds they took."""
        sampler = threading.Thread(target=self.sampler, daemon=True)
        sampler.start()
        threads = [
            threading.Thread(target=fn, args=(k,), name=f"{fn.__name__}{k}")
            for k in range(len(self.groups))
            for fn in (self.sender, self.receiver)
        ]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - start
        self.rss.append((time.monotonic() - self.t0, rss_bytes()))
        self.done.set()
        return seconds


def run_peer(
    role: str, port: int, args: dict[str, Any], sections: dict[str, Any], results: Any
) -> None:
    """The process's main: build the side, run it, report, close after the peer is done."""
    cfg, notes = build_config(sections)
    side = Side(role, port, args, cfg)
    side.store.set(f"soak/ready/{role}", b"1")
    side.store.wait([f"soak/ready/{r}" for r in ROLES], datetime.timedelta(seconds=120))
    seconds = side.run()
    stats = [g.stats()["send"] for g in side.groups]
    results.put(
        (
            role,
            {
                "sent": side.sent,
                "received": side.received,
                "lost": side.lost,
                "reordered": side.reordered,
                "corrupt": side.corrupt,
                "errors": side.errors,
                "seconds": seconds,
                "payload_bytes": sum(s["payload_bytes"] for s in stats),
                "wire_bytes": sum(s["wire_bytes"] for s in stats),
                "rss": side.rss,
                "warm_after": side.warm_after,
                "config": notes,
            },
        )
    )
    side.store.set(f"soak/finished/{role}", b"1")
    side.store.wait([f"soak/finished/{r}" for r in ROLES], datetime.timedelta(seconds=600))
    side.coll.close()
