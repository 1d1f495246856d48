"""Benchmark p2p-collective send/recv against raw torch.distributed (gloo) send/recv.

Two spawned processes on loopback run, in the same run and alternating round by round:

* one-way latency (half a ping-pong round trip) of a small pickled dict sent with
  ``CollectiveGroup.send``/``recv``, against one raw ``dist.send``/``dist.recv`` of a small
  tensor (one gloo message), plus a small tensor through ``send``/``recv`` and
  ``send_tensor``/``recv_tensor``;
* one-way throughput of tensors from 4 KiB to 256 MiB: ``send``/``recv`` (the receiver
  allocates every tensor fresh), ``send_tensor``/``recv_tensor`` (preallocated), and raw
  ``dist.send``/``dist.recv`` into a preallocated buffer and into a fresh one.

Each figure is the best of many short chunks, interleaved kind by kind so that every kind
sees the same machine load (the machine may be shared); medians are reported too. Results go to
``--out`` as JSON and Markdown; ratios against raw gloo are printed.

Usage:
    python benchmarks/bench_p2p.py --out bench-results [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

KiB = 1024
MiB = 1024 * KiB
SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [4 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
SMALL_DICT = {"step": 12345, "loss": 0.03125, "lr": 3e-4, "done": False, "tag": "rollout-7"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _messages_for(size: int) -> int:
    """Messages per timed chunk: about 16 MiB, between 1 and 50 messages."""
    return max(1, min(50, (16 * MiB) // size))


def _peer(rank: int, store_port: int, pg_port: int, args: dict[str, Any], out: Any) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from p2p_collective import Collective

    torch.set_num_threads(1)
    store = dist.TCPStore(
        "127.0.0.1", store_port, is_master=False, timeout=datetime.timedelta(seconds=120)
    )
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{pg_port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
    )
    # The same kind of standalone gloo group p2p-collective builds (device bound to
    # 127.0.0.1 through the options object), used raw: the strictest baseline.
    gloo: Any = dist.ProcessGroupGloo  # type: ignore[attr-defined]
    opts = gloo._Options()
    opts._devices = [gloo.create_device(hostname="127.0.0.1")]
    opts._timeout = datetime.timedelta(seconds=300)
    opts._threads = 1
    raw_pg: Any = gloo(dist.PrefixStore("raw-standalone", store), rank, 2, opts)  # type: ignore[attr-defined]
    me, peer = ("bench-a", "bench-b") if rank == 0 else ("bench-b", "bench-a")
    from p2p_collective import CollectiveConfig

    # Same-node groups take the shared-memory link by default; --transport gloo measures
    # the transport used between nodes.
    config = CollectiveConfig(shared_memory=args["transport"] == "shm")
    coll = Collective(me, store, timeout=120.0, config=config)
    g = coll.create_collective_group([me, peer])
    other = 1 - rank
    results: dict[str, Any] = {"latency": {}, "throughput": {}}

    def barrier() -> None:
        dist.barrier()

    # -- latency: ping-pong, one-way = round trip / 2 ---------------------------------
    small = torch.zeros(64, dtype=torch.uint8)
    tensor_payload = torch.arange(16, dtype=torch.float32)
    buf = torch.empty_like(tensor_payload)

    def pingpong(kind: str, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            if kind == "raw_dist_64B":
                if rank == 0:
                    dist.send(small, other)
                    dist.recv(small, other)
                else:
                    dist.recv(small, other)
                    dist.send(small, other)
            elif kind == "raw_gloo_64B":
                if rank == 0:
                    raw_pg.send([small], other, 0).wait()
                    raw_pg.recv([small], other, 0).wait()
                else:
                    raw_pg.recv([small], other, 0).wait()
                    raw_pg.send([small], other, 0).wait()
            elif kind == "p2p_small_dict":
                if rank == 0:
                    g.send(SMALL_DICT)
                    g.recv()
                else:
                    g.send(g.recv())
            elif kind == "p2p_small_tensor":
                if rank == 0:
                    g.send(tensor_payload)
                    g.recv()
                else:
                    g.send(g.recv())
            elif kind == "p2p_send_tensor_64B":
                if rank == 0:
                    g.send_tensor(tensor_payload)
                    g.recv_tensor(buf)
                else:
                    g.recv_tensor(buf)
                    g.send_tensor(buf)
        return (time.perf_counter() - t0) / (2 * n)

    lat_kinds = [
        "raw_dist_64B",
        "raw_gloo_64B",
        "p2p_small_dict",
        "p2p_small_tensor",
        "p2p_send_tensor_64B",
    ]
    # Short chunks, interleaved kind by kind, so every kind sees the same machine load;
    # the figure per kind is the best and the median chunk.
    chunks, per_chunk = (40, 50) if args["quick"] else (150, 50)
    for kind in lat_kinds:  # warm-up (lazy init of the groups)
        pingpong(kind, 20)
    lat: dict[str, list[float]] = {k: [] for k in lat_kinds}
    for _ in range(chunks):
        for kind in lat_kinds:
            lat[kind].append(pingpong(kind, per_chunk))
    results["latency"] = {
        k: {"best_s": min(v), "median_s": statistics.median(v)} for k, v in lat.items()
    }

    # -- throughput: k messages one way, then a tiny ack ---------------------------------
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def one_way(kind: str, size: int, k: int) -> float:
        numel = size // 4
        if size not in buffers:  # one warm source and one warm destination per size
            buffers.clear()
            buffers[size] = (torch.ones(numel), torch.zeros(numel))
        src, dst = buffers[size]
        ack = torch.zeros(1, dtype=torch.uint8)
        barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            if kind == "raw_dist_prealloc":
                dist.send(src, other) if rank == 0 else dist.recv(dst, other)
            elif kind == "raw_gloo_prealloc":
                if rank == 0:
                    raw_pg.send([src], other, 0).wait()
                else:
                    raw_pg.recv([dst], other, 0).wait()
            elif kind == "raw_gloo_fresh":
                if rank == 0:
                    raw_pg.send([src], other, 0).wait()
                else:
                    raw_pg.recv([torch.empty(numel, dtype=torch.float32)], other, 0).wait()
            elif kind == "p2p_send_recv":
                if rank == 0:
                    g.send(src)
                else:
                    g.recv()
            elif kind == "p2p_send_tensor":
                g.send_tensor(src) if rank == 0 else g.recv_tensor(dst)
        if rank == 0:
            dist.recv(ack, other)
        else:
            dist.send(ack, other)
        return k * size / (time.perf_counter() - t0)

    tp_kinds = [
        "raw_dist_prealloc",
        "raw_gloo_prealloc",
        "raw_gloo_fresh",
        "p2p_send_recv",
        "p2p_send_tensor",
    ]
    for size in args["sizes"]:
        k = _messages_for(size)
        for kind in tp_kinds:
            one_way(kind, size, 1)
        tp: dict[str, list[float]] = {kind: [] for kind in tp_kinds}
        for _ in range(args["rounds"]):
            for kind in tp_kinds:
                tp[kind].append(one_way(kind, size, k))
        results["throughput"][str(size)] = {
            kind: {"best_Bps": max(v), "median_Bps": statistics.median(v)} for kind, v in tp.items()
        }
        results["throughput"][str(size)]["messages"] = k
    results["stats"] = g.stats()
    barrier()
    coll.close()
    dist.destroy_process_group()
    if rank == 0:
        out.put(results)


def _fmt_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def _raw_latency(lat: dict[str, Any]) -> float:
    """The faster raw baseline: dist.send/recv on the default group or a standalone group."""
    return min(lat["raw_dist_64B"]["best_s"], lat["raw_gloo_64B"]["best_s"])


def _raw_prealloc(v: dict[str, Any]) -> float:
    return max(v["raw_dist_prealloc"]["best_Bps"], v["raw_gloo_prealloc"]["best_Bps"])


def _report(res: dict[str, Any], meta: dict[str, Any]) -> str:
    lat = res["latency"]
    raw = _raw_latency(lat)
    lines = [
        "# p2p-collective vs raw torch.distributed (gloo), loopback",
        "",
        f"Command: `{meta['command']}`  ",
        f"p2p transport: {meta.get('transport', 'gloo')} (shm: the same-node shared-memory"
        " link, the default when both peers share a node; gloo: the transport between"
        " nodes).  ",
        f"Host: {meta['host']}, torch {meta['torch']}; throughput: {meta['rounds']} interleaved"
        " rounds of ~16 MiB chunks per kind, best chunk.",
        "Raw baselines: `dist.send/recv` on a default gloo group (raw_dist) and `send/recv`"
        " on a standalone `ProcessGroupGloo` like the ones p2p-collective builds (raw_gloo);"
        " ratios use the faster of the two.",
        "",
        "## One-way latency (half a ping-pong round trip)",
        "",
        "Chunks of 50 round trips, interleaved across the kinds; best and median chunk.",
        "",
        "| payload | best µs | median µs | best / fastest raw gloo message |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind, v in lat.items():
        lines.append(
            f"| {kind} | {v['best_s'] * 1e6:.1f} | {v['median_s'] * 1e6:.1f} |"
            f" {v['best_s'] / raw:.2f}x |"
        )
    lines += [
        "",
        "## One-way throughput (MB/s = 1e6 bytes/s, best chunk of the rounds)",
        "",
        "send/recv returns a new tensor per message (as the API promises; large ones come"
        " from a pool of recycled buffers); raw prealloc and send_tensor receive into one"
        " warm, reused buffer (the best case for raw); raw fresh allocates every buffer.",
        "",
        "| size | msgs/chunk | raw dist prealloc | raw gloo prealloc | raw gloo fresh |"
        " p2p send/recv | p2p send_tensor | send/recv vs raw prealloc |"
        " send/recv vs raw fresh | send_tensor vs raw prealloc |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size, v in res["throughput"].items():
        rd = v["raw_dist_prealloc"]["best_Bps"]
        rg = v["raw_gloo_prealloc"]["best_Bps"]
        rp = _raw_prealloc(v)
        rf = v["raw_gloo_fresh"]["best_Bps"]
        sr = v["p2p_send_recv"]["best_Bps"]
        st = v["p2p_send_tensor"]["best_Bps"]
        lines.append(
            f"| {_fmt_size(int(size))} | {v['messages']} | {rd / 1e6:.0f} | {rg / 1e6:.0f} |"
            f" {rf / 1e6:.0f} | {sr / 1e6:.0f} | {st / 1e6:.0f} | {sr / rp:.2f}x |"
            f" {sr / rf:.2f}x | {st / rp:.2f}x |"
        )
    lines += [
        "",
        "Targets: large tensors >= 0.9x raw gloo throughput; a small object's one-way latency"
        " <= 1.5x one raw gloo message.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output dir")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, rounds and chunks")
    parser.add_argument(
        "--transport",
        choices=["shm", "gloo"],
        default="shm",
        help="p2p transport: same-node shared memory (default on one node) or gloo",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per figure")
    parser.add_argument(
        "--max-size-mib", type=int, default=256, help="largest tensor size in MiB (default 256)"
    )
    ns = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    sizes = [s for s in (QUICK_SIZES if ns.quick else SIZES) if s <= ns.max_size_mib * MiB]
    rounds = ns.rounds or (6 if ns.quick else 15)
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=120),
    )
    args = {"quick": ns.quick, "sizes": sizes, "rounds": rounds, "transport": ns.transport}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    pg_port = _free_port()
    procs = [ctx.Process(target=_peer, args=(r, store.port, pg_port, args, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    res = out.get(timeout=3600)
    for p in procs:
        p.join(timeout=60)
    meta = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})",
        "torch": torch.__version__,
        "rounds": rounds,
        "quick": ns.quick,
        "transport": ns.transport,
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "bench_p2p.json").write_text(json.dumps({"meta": meta, "results": res}, indent=2))
    report = _report(res, meta)
    (ns.out / "bench_p2p.md").write_text(report)
    print(report)
    lat = res["latency"]
    ratio_lat = lat["p2p_small_dict"]["best_s"] / _raw_latency(lat)
    big = [v for s, v in res["throughput"].items() if int(s) >= 16 * MiB]
    ratios = [v["p2p_send_recv"]["best_Bps"] / _raw_prealloc(v) for v in big]
    print(f"small dict latency / raw gloo message: {ratio_lat:.2f}x (target <= 1.5x)")
    if ratios:
        print(
            "large tensors send/recv / raw gloo (prealloc):"
            f" min {min(ratios):.2f}x (target >= 0.9x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
