"""Soak: many mixed messages over 8 groups at once, checked for loss, order and memory.

Two processes ("left" and "right") each hold one ``p2p_collective.Collective`` over a
TCPStore on 127.0.0.1 and open ``--groups`` groups with each other. In every group both
directions carry ``--messages / (2 * groups)`` messages, sent asynchronously (a window of
``--window`` handles in flight per group and direction) by one thread per group and
direction, while one receiving thread per group and direction keeps ``--window`` receives
posted. Messages are of mixed kinds (pickled objects, tensors, lists, dicts and a
dataclass of tensors, bf16, an occasional 1 MiB tensor), built deterministically from
(group, direction, sequence number), so the receiver rebuilds each expected message and
compares it byte for byte. Compression (``--codec``) and link emulation
(``--bandwidth-mbps``, ``--delay-ms``) are configured where the installed p2p-collective
accepts them.

It prints: messages sent and received, lost (sent but never received), reordered (a
sequence number other than the next one), corrupt (content differs), errors, the
throughput, wire vs payload bytes, and each process's resident memory sampled every
``--sample-seconds``: after warm-up, at the end, the peak, and the slope over the second
half. Exit status 0 when nothing was lost, reordered or corrupt and memory stayed flat.

Usage (not part of CI; a full run takes tens of minutes on two cores)::

    python benchmarks/soak/soak.py                      # 1,000,000 messages
    python benchmarks/soak/soak.py --messages 20000     # a quick one
    python benchmarks/soak/soak.py --minutes 10         # stop sending after 10 minutes
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_peer import run_peer

STORE_TIMEOUT = datetime.timedelta(seconds=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000, help="total messages (1000000)")
    p.add_argument("--groups", type=int, default=8, help="groups between the two processes (8)")
    p.add_argument("--window", type=int, default=32, help="async handles in flight (32)")
    p.add_argument("--minutes", type=float, default=None, help="stop sending after this long")
    p.add_argument("--codec", choices=["lz4", "zstd", "none"], default="lz4", help="(lz4)")
    p.add_argument("--bandwidth-mbps", type=float, default=10000.0, help="emulated (10000)")
    p.add_argument("--delay-ms", type=float, default=0.05, help="emulated one-way delay (0.05)")
    p.add_argument("--no-emulation", action="store_true", help="leave link emulation off")
    p.add_argument(
        "--transport",
        choices=["shm", "gloo"],
        default="shm",
        help="same-node shared memory (the default on one node) or gloo, as between nodes",
    )
    p.add_argument("--sample-seconds", type=float, default=1.0, help="RSS sampling period (1)")
    p.add_argument(
        "--rss-growth-mib", type=float, default=64.0, help="allowed growth after warm-up (64)"
    )
    args = p.parse_args(argv)
    if args.messages < 2 * args.groups or args.groups < 1 or args.window < 1:
        p.error("--messages must be >= 2 * --groups; --groups and --window >= 1")
    return args


def collective_sections(args: argparse.Namespace) -> dict[str, Any]:
    """The ``cluster.collective`` and ``cluster.net_emulation`` sections asked for."""
    collective: dict[str, Any] = {
        "init_timeout": 120.0,
        "op_timeout": 600.0,
        "shared_memory": args.transport == "shm",
    }
    if args.codec != "none":
        collective["tensor_compression"] = {
            "enabled": True,
            "codec": args.codec,
            "min_bytes": 16384,
        }
    emulation = None
    if not args.no_emulation:
        emulation = {
            "enabled": True,
            "bandwidth_mbps": args.bandwidth_mbps,
            "delay_ms": args.delay_ms,
        }
    return {"collective": collective, "net_emulation": emulation}


def rss_summary(samples: list[tuple[float, int]], warm_after: float) -> dict[str, float]:
    """Start (after warm-up), end, peak, growth and late slope of RSS samples, in MiB."""
    mib = 1 << 20
    warm = [(t, r) for t, r in samples if t >= warm_after] or samples
    start, end = warm[0][1], warm[-1][1]
    half = warm[len(warm) // 2 :]
    slope = float("nan")  # too short a run to fit a slope
    if len(half) >= 3 and half[-1][0] - half[0][0] >= 30.0:
        ts = [t for t, _ in half]
        rs = [r for _, r in half]
        mt, mr = sum(ts) / len(ts), sum(rs) / len(rs)
        var = sum((t - mt) ** 2 for t in ts)
        if var > 0:
            slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rs, strict=True)) / var
    return {
        "start": start / mib,
        "end": end / mib,
        "peak": max(r for _, r in warm) / mib,
        "growth": (end - start) / mib,
        "slope_per_min": slope * 60 / mib,  # over the second half, when it spans >= 30 s
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT
    )
    sections = collective_sections(args)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    peers = [
        ctx.Process(
            target=run_peer,
            args=(role, store.port, vars(args), sections, results),
            name=f"soak-{role}",
        )
        for role in ("left", "right")
    ]
    t0 = time.monotonic()
    for p in peers:
        p.start()
    total = args.messages
    emulation = (
        "off" if args.no_emulation else f"{args.bandwidth_mbps:g} Mbit/s + {args.delay_ms:g} ms"
    )
    print(
        f"soak: {total:,} messages over {args.groups} groups (both directions), window "
        f"{args.window}, codec {args.codec}, emulation {emulation}, transport {args.transport}"
        + (f", budget {args.minutes:g} min" if args.minutes else ""),
        flush=True,
    )
    reports: dict[str, Any] = {}
    last_print = 0.0
    while len(reports) < 2:
        try:
            role, report = results.get(timeout=5.0)
            reports[role] = report
            continue
        except Exception:
            pass
        if not all(p.is_alive() for p in peers) and results.empty():
            dead = [p.name for p in peers if not p.is_alive() and p.exitcode != 0]
            if dead:
                print(f"soak: peer process died: {dead}", flush=True)
                return 2
        now = time.monotonic()
        if now - last_print >= 10.0:
            done = sum(int(store.add(f"soak/received/{r}", 0)) for r in ("left", "right"))
            print(f"  {now - t0:7.1f} s  {done:,} received", flush=True)
            last_print = now
    for p in peers:
        p.join(timeout=60)
    exits = {p.name: p.exitcode for p in peers}
    print(f"peer exit codes     {exits}")
    code = report_and_verdict(args, reports, time.monotonic() - t0)
    return code if all(c == 0 for c in exits.values()) else max(code, 3)


def report_and_verdict(args: argparse.Namespace, reports: dict[str, Any], wall: float) -> int:
    sent = sum(r["sent"] for r in reports.values())
    received = sum(r["received"] for r in reports.values())
    lost = sum(r["lost"] for r in reports.values())
    reordered = sum(r["reordered"] for r in reports.values())
    corrupt = sum(r["corrupt"] for r in reports.values())
    errors = [e for r in reports.values() for e in r["errors"]]
    payload = sum(r["payload_bytes"] for r in reports.values())
    wire = sum(r["wire_bytes"] for r in reports.values())
    busy = max(r["seconds"] for r in reports.values())
    print()
    print(f"messages sent       {sent:>14,}")
    print(f"messages received   {received:>14,}")
    print(f"lost                {lost:>14,}")
    print(f"reordered           {reordered:>14,}")
    print(f"corrupt             {corrupt:>14,}")
    print(f"errors              {len(errors):>14,}")
    for e in errors[:5]:
        print(f"    {e}")
    print(f"throughput          {received / busy:>14,.0f} msg/s ({busy:.1f} s of sending)")
    print(
        f"bytes               {payload / 2**20:>11,.1f} MiB payload, {wire / 2**20:,.1f} MiB on"
        f" the wire (ratio {wire / max(payload, 1):.3f})"
    )
    applied = "yes" if wire < 0.95 * payload else "no (wire bytes >= 95% of payload bytes)"
    print(f"compression applied {applied}")
    for role, r in sorted(reports.items()):
        print(f"config {role:<12} {r['config']}")
    flat = True
    for role, r in sorted(reports.items()):
        s = rss_summary(r["rss"], r["warm_after"])
        ok = s["growth"] <= args.rss_growth_mib
        flat = flat and ok
        slope = "n/a" if s["slope_per_min"] != s["slope_per_min"] else f"{s['slope_per_min']:+.1f}"
        print(
            f"rss {role:<6}          after warm-up {s['start']:.0f} MiB, end {s['end']:.0f} MiB,"
            f" peak {s['peak']:.0f} MiB, growth {s['growth']:+.1f} MiB, late slope"
            f" {slope} MiB/min ({len(r['rss'])} samples) -> {'flat' if ok else 'GROWING'}"
        )
    good = lost == 0 and reordered == 0 and corrupt == 0 and not errors and flat
    print(f"\nsoak: {'PASS' if good else 'FAIL'} in {wall:.1f} s")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
