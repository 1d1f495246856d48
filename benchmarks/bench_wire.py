"""Benchmark tensor compression on the wire over emulated links: raw, lz4, zstd, adaptive.

Two spawned processes on loopback stream tensors of the p2p-compress benchmark's data
kinds (``p2p_compress.SYNTHETIC_KINDS``) through ``CollectiveGroup.send`` / ``recv``: a
burst of asynchronous sends of one tensor each, received by asynchronous receives posted
beforehand. Effective throughput is raw tensor bytes delivered per second, from the
sender's first send to the receiver's last completed receive (one machine, one
monotonic clock). Every (link, codec) pair has its own pair of Collectives configured
with ``cluster.net_emulation`` and ``tensor_compression``; all pairs run in the same
run, interleaved cell by cell within each round (after a warm-up of three sends per
cell, where the adaptive mode learns its link; each round rotates the order of the
codecs of a link and data kind), and ratios compare medians of rounds against
raw's on the same link. Each cell sends enough tensors to last ``--min-cell-seconds`` at
the rate its own warm-up showed (at least ``--messages``, at most 32 times that), so a
shared-memory cell moves gigabytes and a slow codec's cell no more than it needs; the
receiver checks the first received tensors (up to 1 GiB) and the last one bit for bit
and drops the others as they arrive.

``--busy-core CPU`` keeps that CPU busy for the whole run with another process (``python
-c 'while True: pass'`` pinned to it with ``os.sched_setaffinity``, as ``taskset -c CPU``
would), to measure what a loaded machine does to each codec and to the adaptive mode.

Links: emulated 100 Mbit/s, 1 Gbit/s, 10 Gbit/s (no delay, shared memory underneath),
plain gloo over loopback and plain shared memory. Codecs: ``raw`` (no compression),
``lz4`` and ``zstd`` (level 1) trying every dtype (``excluded_dtypes: []``),
``default`` (lz4 with the seed's defaults: float32 excluded, min_bytes 16 KiB) and
``auto`` (``compression_pipeline.adaptive: true``: raw, lz4, zstd or sparse per link). A second
table compares overlapped codec work (compressor and decoder threads) with codec work
done in line by the direction threads, on the 1 Gbit/s link, for single tensors and
for lists of four.

Usage:
    python benchmarks/bench_wire.py --out bench-results [--quick] [--busy-core 0]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
LINKS: dict[str, float | None] = {
    "100M": 100.0,
    "1G": 1000.0,
    "10G": 10000.0,
    "loopback": None,
    "shm": None,
}
"""Emulated bandwidths in Mbit/s; ``loopback`` is gloo over 127.0.0.1, ``shm`` shared memory."""
CODECS: dict[str, dict[str, Any] | None] = {
    "raw": None,
    "lz4": {"codec": "lz4", "excluded_dtypes": []},
    "zstd": {"codec": "zstd", "level": 1, "excluded_dtypes": []},
    "default": {"codec": "lz4"},
    "auto": {"codec": "zstd", "level": 1, "excluded_dtypes": []},
}
"""``auto``: ``compression_pipeline.adaptive: true`` (raw, lz4, zstd or sparse, per link)."""
OVERLAP_KINDS = ("int64_token_ids", "sparse_float32")
TIMEOUT = 600.0
WARM_SENDS = 3
"""Sends per cell before the rounds (a real link's adaptive mode sends two raw, then learns)."""
MAX_COUNT_FACTOR = 32
"""A fast cell sends at most this many times ``--messages``."""
CHECK_BYTES = 1 << 30
"""The receiver keeps (and checks) at most this many bytes of a cell's first tensors."""
BUSY_LOOP = "while True: pass"


def _cluster(link: str, codec: str, overlap: bool = True, threads: int = 0) -> dict[str, Any]:
    cluster: dict[str, Any] = {"collective": {}}
    if CODECS[codec] is not None:
        cluster["collective"]["tensor_compression"] = CODECS[codec]
        pipeline: dict[str, Any] = {"overlap": overlap}
        if codec == "auto":
            pipeline["adaptive"] = True
        if threads:
            pipeline["compressor_threads"] = threads
        cluster["collective"]["compression_pipeline"] = pipeline
    cluster["collective"]["shared_memory"] = link != "loopback"
    if LINKS[link] is not None:
        cluster["net_emulation"] = {"bandwidth_mbps": LINKS[link], "delay_ms": 0}
    return cluster


def _cells(args: dict[str, Any]) -> list[dict[str, Any]]:
    """The schedule of one round, identical in both processes."""
    cells = [
        {"link": link, "codec": codec, "kind": kind, "shape": "tensor", "overlap": True}
        for link in args["links"]
        for kind in args["kinds"]
        for codec in args["codecs"]
        if "main" in args["sections"]
    ]
    for kind in OVERLAP_KINDS if "overlap" in args["sections"] else ():
        for codec in ("lz4", "zstd"):
            for shape in ("tensor", "list4"):
                for overlap in (True, False):
                    cells.append(
                        {
                            "link": "1G",
                            "codec": codec,
                            "kind": kind,
                            "shape": shape,
                            "overlap": overlap,
                            "section": "overlap",
                        }
                    )
    return cells


def _round_order(cells: list[dict[str, Any]], r: int) -> list[int]:
    """Cell indexes of round ``r``: each run of cells of one (link, kind, shape) rotated by r.

    So no codec always follows the same neighbour (a cell after a compressing one may
    find the heap, the caches or the other process's threads in another state), and
    every codec takes every place in turn.
    """
    order: list[int] = []
    start = 0
    for i in range(1, len(cells) + 1):
        same = i < len(cells) and all(
            cells[i][k] == cells[start][k] for k in ("link", "kind", "shape", "overlap")
        )
        if not same:
            group = list(range(start, i))
            shift = r % len(group)
            order += group[shift:] + group[:shift]
            start = i
    return order


def _peer(role: str, store_port: int, args: dict[str, Any], out: Any) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import dataclasses

    import torch
    import torch.distributed as dist

    from p2p_collective import Collective, parse_collective_config, parse_net_emulation
    from p2p_compress import make_synthetic_tensor

    torch.set_num_threads(1)
    store = dist.TCPStore(
        "127.0.0.1", store_port, is_master=False, timeout=datetime.timedelta(seconds=TIMEOUT)
    )
    me, peer = ("tx", "rx") if role == "tx" else ("rx", "tx")
    colls: dict[tuple[str, str, bool], Any] = {}
    groups: dict[tuple[str, str, bool], Any] = {}

    def group(link: str, codec: str, overlap: bool) -> Any:
        key = (link, codec, overlap)
        if key not in groups:
            cluster = _cluster(link, codec, overlap, args["compressor_threads"])
            cfg = parse_collective_config(cluster["collective"], "cluster.collective")
            net = parse_net_emulation(cluster.get("net_emulation"), "cluster.net_emulation")
            cfg = dataclasses.replace(cfg, net_emulation=net)
            name = f"{me}/{link}/{codec}/{'ov' if overlap else 'inline'}"
            colls[key] = Collective(name, store, config=cfg, timeout=TIMEOUT)
            peer_name = f"{peer}/{link}/{codec}/{'ov' if overlap else 'inline'}"
            groups[key] = colls[key].create_collective_group([name, peer_name])
        return groups[key]

    size, count = args["size"], args["messages"]
    data = {k: make_synthetic_tensor(k, size, seed=1) for k in args["kinds"]}
    quarters = {k: [make_synthetic_tensor(k, size // 4, seed=s) for s in range(4)] for k in data}

    def payload(cell: dict[str, Any]) -> Any:
        return data[cell["kind"]] if cell["shape"] == "tensor" else quarters[cell["kind"]]

    def barrier(key: str) -> None:
        store.set(f"bw/{key}/{role}", b"1")
        store.wait([f"bw/{key}/tx", f"bw/{key}/rx"], datetime.timedelta(seconds=TIMEOUT))

    def run_cell(cell: dict[str, Any], key: str, n: int) -> dict[str, Any] | None:
        g = group(cell["link"], cell["codec"], cell["overlap"])
        if role == "rx":
            if n <= 0:  # the sender sized this cell
                n = int(store.get(f"bw/count/{key}").decode())
            works = [g.recv(async_op=True, timeout=TIMEOUT) for _ in range(n)]
            barrier(key)
            c0 = time.process_time()
            keep = max(1, CHECK_BYTES // size)
            got = []
            for i in range(n):  # drop what is not checked (a shm cell moves gigabytes)
                x = works[i].wait(timeout=TIMEOUT)
                works[i] = None
                if i < keep or i == n - 1:
                    got.append(x)
                del x
            t1 = time.monotonic()
            cpu = time.process_time() - c0
            want = payload(cell)
            if cell["shape"] == "tensor":
                ok = all(torch.equal(x, want) for x in got)
            else:
                ok = all(torch.equal(a, b) for x in got for a, b in zip(x, want, strict=True))
            g.send((t1, ok, cpu), timeout=TIMEOUT)
            return None
        before = g.stats()["send"]
        barrier(key)
        t0 = time.monotonic()
        c0 = time.process_time()
        works = [g.send(payload(cell), async_op=True, timeout=TIMEOUT) for _ in range(n)]
        for w in works:
            w.wait(timeout=TIMEOUT)
        t1, ok, rx_cpu = g.recv(timeout=TIMEOUT)
        cpu = time.process_time() - c0 + rx_cpu
        after = g.stats()["send"]
        if not ok:
            raise AssertionError(f"received data differs: {cell}")
        raw = after["tensor_raw_bytes"] - before["tensor_raw_bytes"]
        return {
            **cell,
            "seconds": t1 - t0,
            "raw_bytes": raw,
            "tensor_wire_bytes": after["tensor_wire_bytes"] - before["tensor_wire_bytes"],
            "wire_bytes": after["wire_bytes"] - before["wire_bytes"],
            "Bps": raw / (t1 - t0),
            "cpu_s": cpu,  # both processes, every thread
            "cpu_per_byte": cpu / raw,
            "raw_reasons": {
                k: v - before["raw_reasons"].get(k, 0)
                for k, v in after["raw_reasons"].items()
                if v - before["raw_reasons"].get(k, 0)
            },
            # per frame: how many went compressed (auto: its decisions), and its last reason
            "compressed_tensors": after["compressed_tensors"] - before["compressed_tensors"],
            "adaptive_reason": after.get("adaptive", {}).get("reason"),
            "adaptive_switches": after.get("adaptive", {}).get("switches", 0)
            - before.get("adaptive", {}).get("switches", 0),
        }

    cells = _cells(args)
    rates: list[float] = []
    for i, cell in enumerate(cells):  # warm-up: connect, create codecs and pooled buffers
        warm = run_cell(cell, f"warm{i}", WARM_SENDS)  # auto learns its link and codecs here
        rates.append(0.0 if warm is None else warm["Bps"])
    # Each cell sends enough tensors to last min_cell_s at its warm-up rate (a 30 ms cell
    # on a fast link is noise on a busy host; a slow codec's cell is long anyway).
    counts = []
    for rate in rates:
        want = int(rate * args["min_cell_s"] / size)
        counts.append(max(count, min(want + 1, MAX_COUNT_FACTOR * count)))
    results = []
    for r in range(args["rounds"]):
        for i in _round_order(cells, r):
            cell = cells[i]
            key = f"r{r}c{i}"
            if role == "tx":
                store.set(f"bw/count/{key}", str(counts[i]).encode())
            res = run_cell(cell, key, counts[i] if role == "tx" else 0)
            if res is not None:
                res["round"] = r
                results.append(res)
                if args["verbose"]:
                    print(
                        f"round {r} {cell['link']:>8} {cell['codec']:>7} {cell['kind']:>16}"
                        f" {cell['shape']:>6} overlap={cell['overlap']!s:5}"
                        f" {res['Bps'] / 1e6:8.1f} MB/s",
                        flush=True,
                    )
    barrier("done")
    for coll in colls.values():
        coll.close()
    if role == "tx":
        out.put(results)


def _best(results: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    rows = [r for r in results if all(r.get(k) == v for k, v in match.items())]
    return max(rows, key=lambda r: r["Bps"])


def _median(results: list[dict[str, Any]], **match: Any) -> float:
    """The median over rounds of a cell's throughput (bytes per second)."""
    return float(
        statistics.median(r["Bps"] for r in results if all(r.get(k) == v for k, v in match.items()))
    )


def _paired(results: list[dict[str, Any]], base: str, key: str = "Bps", **match: Any) -> float:
    """The median over rounds of a cell's ``key`` over codec ``base``'s in the same round.

    Cells of one round run back to back, so pairing them cancels most of what a busy
    host does to both; the median then drops the rounds something hit one of them.
    """
    by_round = {r["round"]: r[key] for r in _rows(results, **match)}
    other = {**match, "codec": base}
    pairs = [
        by_round[r["round"]] / r[key] for r in _rows(results, **other) if r["round"] in by_round
    ]
    return float(statistics.median(pairs))


def _rows(results: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in results if all(r.get(k) == v for k, v in match.items())]


def _report(results: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[str, dict[str, float]]:
    rounds, kinds = meta["rounds"], meta["kinds"]
    main = [r for r in results if r.get("section") is None]
    codecs = [c for c in CODECS if any(r["codec"] == c for r in main)]
    lines = [
        "# Compression on the wire: effective throughput over emulated links",
        "",
        f"Command: `{meta['command']}`  ",
        f"Load: {meta['load']}.  ",
        f"Host: {meta['host']}, torch {meta['torch']}; {meta['messages']} asynchronous sends"
        f" of one {meta['size'] // MiB} MiB tensor per cell, {rounds} round(s), every codec"
        " interleaved within each round; medians of rounds.",
        "MB/s = 1e6 raw tensor bytes delivered per second (sender's first send to receiver's"
        " last receive), median of rounds. A fast cell sends more tensors, enough to last"
        f" {meta['min_cell_s']} s at its warm-up rate (up to {MAX_COUNT_FACTOR}x the sends)."
        " `x` = median over rounds of the cell against raw in the same round.",
        "lz4 / zstd try every dtype (`excluded_dtypes: []`, zstd level 1); default = lz4 with"
        " the seed's defaults (float32 excluded); auto = adaptive (raw, lz4, zstd or sparse per"
        " link),"
        " `auto/best` = auto against the best of raw, lz4 and zstd on that link (by median,"
        " named), paired by round like `x`; `auto shrink` = raw / wire bytes of auto's"
        " tensors (1.00: it sent them raw); `auto CPU / raw CPU` = CPU seconds of both"
        " processes (every thread) per raw byte, auto's over raw's, paired by round like `x`"
        " (what the adaptive mode costs, less swayed by the host's load than wall time).",
        "",
    ]
    targets: dict[str, float] = {}
    for link in [lk for lk in LINKS if any(r["link"] == lk for r in main)]:
        label = {"loopback": "gloo over loopback", "shm": "shared memory"}.get(
            link, f"emulated {link}bit/s link"
        )
        head = ["kind", *(f"{c} MB/s" for c in codecs), *(f"{c} x" for c in codecs if c != "raw")]
        if "auto" in codecs:
            head += ["auto/best", "auto shrink", "auto CPU / raw CPU"]
        lines += [f"## {label}", "", "| " + " | ".join(head) + " |"]
        lines.append("| --- |" + " ---: |" * (len(head) - 1))
        for kind in kinds:
            med = {c: _median(main, link=link, codec=c, kind=kind) for c in codecs}
            cols = [kind, *(f"{med[c] / 1e6:.0f}" for c in codecs)]
            for c in codecs:
                if c != "raw":
                    x = _paired(main, "raw", link=link, codec=c, kind=kind)
                    targets[f"{link}/{c}/{kind}"] = x
                    cols.append(f"{x:.2f}x")
            if "auto" in codecs:
                best = max((c for c in ("raw", "lz4", "zstd") if c in med), key=lambda c: med[c])
                x = _paired(main, best, link=link, codec="auto", kind=kind)
                targets[f"{link}/auto_of_best/{kind}"] = x
                cols.append(f"{x:.2f} ({best})")
                rows = _rows(main, link=link, codec="auto", kind=kind)
                raw_b = sum(r["raw_bytes"] for r in rows)
                cols.append(f"{raw_b / max(1, sum(r['tensor_wire_bytes'] for r in rows)):.2f}")
                if "raw" in codecs:
                    cpu = _paired(main, "raw", "cpu_per_byte", link=link, codec="auto", kind=kind)
                    targets[f"{link}/auto_cpu_of_raw/{kind}"] = cpu
                    cols.append(f"{cpu:.2f}")
                else:
                    cols.append("-")
            lines.append("| " + " | ".join(cols) + " |")
        lines.append("")
    ov = [r for r in results if r.get("section") == "overlap"]
    if ov:
        lines += _overlap_lines(ov)
    lines += _target_lines(targets)
    return "\n".join(lines), targets


def _overlap_lines(ov: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Overlap of codec work with the wire (emulated 1 Gbit/s)",
        "",
        "overlapped: asynchronous sends are compressed by the compressor thread while earlier"
        " frames are on the wire, and a list's payloads are decoded by the decoder thread"
        " while the next one arrives; in line: the direction threads do the codec work"
        " between messages. `list4` sends four tensors of a quarter size per message.",
        "",
        "| kind | codec | payload | overlapped MB/s | in line MB/s | overlapped / in line |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for kind in OVERLAP_KINDS:
        for codec in ("lz4", "zstd"):
            for shape in ("tensor", "list4"):
                on = _best(ov, kind=kind, codec=codec, shape=shape, overlap=True)
                off = _best(ov, kind=kind, codec=codec, shape=shape, overlap=False)
                lines.append(
                    f"| {kind} | {codec} | {shape} | {on['Bps'] / 1e6:.0f} |"
                    f" {off['Bps'] / 1e6:.0f} | {on['Bps'] / off['Bps']:.2f}x |"
                )
    return lines


def _target_lines(targets: dict[str, float]) -> list[str]:
    """Issue 21's targets at emulated 1 Gbit/s, for the cells this run measured."""

    def got(codec: str, kind: str) -> float | None:
        return targets.get(f"1G/{codec}/{kind}")

    rows = [
        ("int64 token ids, zstd", got("zstd", "int64_token_ids"), 2.5),
        ("int64 token ids, lz4", got("lz4", "int64_token_ids"), 2.0),
        ("sparse float32 (90% zeros), auto", got("auto", "sparse_float32"), 3.0),
        ("random float32, default config", got("default", "random_float32"), 0.95),
        ("random float32, auto", got("auto", "random_float32"), 0.95),
    ]
    lines = ["", "## Targets (emulated 1 Gbit/s, x raw)", ""]
    for label, value, target in rows:
        if value is not None:
            mark = "met" if value >= target else "NOT met"
            lines.append(f"- {label}: {value:.2f}x (target >= {target}x, {mark})")
    for key, value in sorted(targets.items()):
        if "/auto_of_best/" in key:
            mark = "met" if value >= 0.9 else "NOT met"
            lines.append(
                f"- auto / best on {key.replace('/auto_of_best/', ', ')}:"
                f" {value:.2f} (target >= 0.9, {mark})"
            )
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output dir")
    parser.add_argument("--quick", action="store_true", help="one round, smaller bursts")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 1)")
    parser.add_argument("--size-mib", type=int, default=4, help="tensor size in MiB (default 4)")
    parser.add_argument("--messages", type=int, default=None, help="sends per cell (at least)")
    parser.add_argument(
        "--min-cell-seconds",
        type=float,
        default=0.5,
        help=f"a cell sends more tensors (up to {MAX_COUNT_FACTOR}x --messages) to last this"
        " long (default 0.5)",
    )
    parser.add_argument("--verbose", action="store_true", help="print every cell as it runs")
    parser.add_argument(
        "--busy-core",
        type=int,
        default=None,
        metavar="CPU",
        help="keep CPU busy with another process for the whole run (a pinned busy loop)",
    )
    parser.add_argument(
        "--compressor-threads", type=int, default=None, help="compressor threads per Collective"
    )
    parser.add_argument(
        "--sections", default="main,overlap", help="comma-separated: main, overlap (default both)"
    )
    parser.add_argument(
        "--links", default=",".join(LINKS), help=f"main-table links (default {','.join(LINKS)})"
    )
    parser.add_argument("--kinds", default="", help="data kinds (default: every synthetic kind)")
    parser.add_argument(
        "--codecs", default=",".join(CODECS), help=f"main-table codecs (default {','.join(CODECS)})"
    )
    ns = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    from p2p_compress import SYNTHETIC_KINDS

    args = {
        "size": ns.size_mib * MiB,
        "messages": ns.messages or (3 if ns.quick else 6),
        "rounds": ns.rounds or (1 if ns.quick else 3),
        "kinds": [k for k in ns.kinds.split(",") if k] or list(SYNTHETIC_KINDS),
        "codecs": [c for c in ns.codecs.split(",") if c],
        "verbose": ns.verbose,
        "sections": ns.sections.split(","),
        "compressor_threads": ns.compressor_threads,
        "links": [link for link in ns.links.split(",") if link],
        "min_cell_s": ns.min_cell_seconds,
    }
    unknown = [link for link in args["links"] if link not in LINKS]
    if unknown:
        parser.error(f"--links: unknown {unknown}; allowed: {', '.join(LINKS)}")
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=TIMEOUT),
    )
    busy = None
    if ns.busy_core is not None:  # as `taskset -c CPU python -c 'while True: pass'`
        busy = subprocess.Popen(
            [sys.executable, "-c", BUSY_LOOP],
            preexec_fn=lambda: os.sched_setaffinity(0, {ns.busy_core}),
        )
    load0 = os.getloadavg()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(role, store.port, args, out)) for role in ("tx", "rx")]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    try:
        results = out.get(timeout=3 * 3600)
        for p in procs:
            p.join(timeout=60)
    finally:
        load1 = os.getloadavg()
        if busy is not None:
            busy.kill()
            busy.wait(timeout=10)
    load = f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end (1 min)"
    if ns.busy_core is not None:
        load += f"; CPU {ns.busy_core} kept busy by `python -c '{BUSY_LOOP}'` pinned to it"
    meta = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})",
        "torch": torch.__version__,
        "rounds": args["rounds"],
        "messages": args["messages"],
        "min_cell_s": args["min_cell_s"],
        "size": args["size"],
        "kinds": args["kinds"],
        "quick": ns.quick,
        "elapsed_s": time.monotonic() - t0,
        "load": load,
    }
    report, targets = _report(results, meta)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "bench_wire.json").write_text(
        json.dumps({"meta": meta, "targets": targets, "results": results}, indent=2)
    )
    (ns.out / "bench_wire.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
