"""p2p channels against ``ray.util.queue.Queue``, measured in the same run on an embedded cluster.

For each payload kind -- small objects (a dict of a few Python values) and 1 MiB float32
tensors -- and for 1 and 4 producer/consumer pairs, every producer puts N items into one
shared queue and every consumer gets N items out of it; the time is the driver's wall
clock from the start of all producers and consumers to the end of the last one (after a
warm-up round). Both queues have the same ``maxsize`` and run between the same worker
processes:

- ``p2p``: a channel (``Worker.create_channel``); ``put``/``get`` as written, one at a
  time;
- ``p2p async``: the same channel, with up to 8 ``put(async_op=True)`` in flight per
  producer;
- ``p2p batch``: async puts as above, and consumers take up to 8 items per
  ``get_batch`` (one control call for several items);
- ``ray queue``: ``ray.util.queue.Queue`` with blocking ``put``/``get``.

Items/s counts items through the queue (all pairs together); MB/s counts their payload
bytes (tensor bytes; pickled size for objects). Ratio = p2p items/s / ray queue items/s.

It prints the table and writes ``bench_channel.json`` and ``bench_channel.md`` into
``--out``. ``--quick`` uses fewer items (about a minute).

Usage: python benchmarks/bench_channel.py --out bench-out [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
import torch
from ray.util.queue import Queue

from p2p_worker import Cluster, PackedPlacementStrategy, Worker, create_channel

MIB = 1 << 20
MAXSIZE = 16
WINDOW = 8


def make_item(kind: str, i: int) -> Any:
    if kind == "small":
        return {"step": i, "reward": 0.5, "tag": "rollout", "done": False}
    return torch.full((MIB // 4,), float(i), dtype=torch.float32)


def item_bytes(kind: str) -> int:
    if kind == "small":
        return len(pickle.dumps(make_item(kind, 1), protocol=pickle.HIGHEST_PROTOCOL))
    return MIB


class Producer(Worker):
    """Puts items into a channel or a Ray queue."""

    def produce(self, method: str, target: Any, kind: str, n: int) -> int:
        """Put ``n`` items of ``kind``; ``target`` is a channel name or a Ray Queue."""
        items = [make_item(kind, i) for i in range(min(n, 4))]
        if method == "ray queue":
            for i in range(n):
                target.put(items[i % len(items)])
            return n
        ch = self.connect_channel(target)
        if method == "p2p":
            for i in range(n):
                ch.put(items[i % len(items)])
            return n
        pending = []
        for i in range(n):
            pending.append(ch.put(items[i % len(items)], async_op=True))
            if len(pending) >= WINDOW:
                pending.pop(0).wait()
        for work in pending:
            work.wait()
        return n


class Consumer(Worker):
    """Gets items out of a channel or a Ray queue and checks them."""

    def consume(self, method: str, target: Any, kind: str, n: int) -> int:
        """Get ``n`` items; return how many were well formed."""
        if method == "ray queue":
            get = target.get
        else:
            ch = self.connect_channel(target)
            get = ch.get
        ok = 0
        left = n
        while left:
            items = ch.get_batch(max_items=min(WINDOW, left)) if method == "p2p batch" else [get()]
            left -= len(items)
            for item in items:
                if kind == "small":
                    ok += item["tag"] == "rollout"
                else:
                    ok += item.numel() == MIB // 4 and float(item[-1]) == float(item[0])
        return ok


def run_round(
    producers: Any, consumers: Any, pairs: int, method: str, target: Any, kind: str, n: int
) -> float:
    start = time.perf_counter()
    cons = [consumers.execute_on(r).consume(method, target, kind, n) for r in range(pairs)]
    prods = [producers.execute_on(r).produce(method, target, kind, n) for r in range(pairs)]
    for h in prods:
        h.wait()
    ok = [h.wait()[0] for h in cons]
    elapsed = time.perf_counter() - start
    if ok != [n] * pairs:
        raise AssertionError(f"{method}: consumers got malformed items: {ok}")
    return elapsed


def bench(
    cluster: Cluster, counts: dict[str, int], repeats: int, kinds: list[str], pairs_list: list[int]
) -> list[dict[str, Any]]:
    rows = []
    for pairs in pairs_list:
        strategy = PackedPlacementStrategy(pairs, cpus_per_worker=0)
        producers = Producer.create_group().launch(cluster, strategy, name=f"bprod{pairs}")
        consumers = Consumer.create_group().launch(cluster, strategy, name=f"bcons{pairs}")
        for kind in kinds:
            n = counts[kind]
            name = f"bench_{pairs}_{kind}"
            channel = create_channel(cluster, name, maxsize=MAXSIZE)
            rq = Queue(maxsize=MAXSIZE, actor_options={"num_cpus": 0})
            targets = {"p2p": name, "p2p async": name, "p2p batch": name, "ray queue": rq}
            for method, target in targets.items():  # warm up every path
                run_round(producers, consumers, pairs, method, target, kind, max(4, n // 10))
            times: dict[str, list[float]] = {m: [] for m in targets}
            for _ in range(repeats):  # interleave, so load from elsewhere hits all alike
                for method, target in targets.items():
                    times[method].append(
                        run_round(producers, consumers, pairs, method, target, kind, n)
                    )
            best = {m: min(t) for m, t in times.items()}
            total = n * pairs
            nbytes = item_bytes(kind)
            for method in targets:
                rate = total / best[method]
                row = {
                    "kind": kind,
                    "pairs": pairs,
                    "method": method,
                    "items": total,
                    "seconds": best[method],
                    "items_per_s": rate,
                    "mb_per_s": rate * nbytes / 1e6,
                    "ratio_vs_ray_queue": best["ray queue"] / best[method],
                }
                rows.append(row)
                print(
                    f"  {kind:6s} {pairs} pair(s) {method:10s} {rate:9.0f} items/s "
                    f"{row['mb_per_s']:9.3f} MB/s   x{row['ratio_vs_ray_queue']:.2f} vs ray queue",
                    flush=True,
                )
            channel.destroy()
            ray.kill(rq.actor)
        producers.shutdown()
        consumers.shutdown()
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# p2p channel benchmark",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']}  ",
        f"Load: {result['load']}  ",
        f"maxsize {MAXSIZE}; items per producer: {result['counts']}; best of "
        f"{result['repeats']} rounds",
        "",
        "| payload | pairs | method | items/s | MB/s | vs ray queue |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        payload = "small object" if r["kind"] == "small" else "1 MiB tensor"
        lines.append(
            f"| {payload} | {r['pairs']} | {r['method']} | {r['items_per_s']:.0f} "
            f"| {r['mb_per_s']:.3g} | {r['ratio_vs_ray_queue']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument("--quick", action="store_true", help="fewer items (about a minute)")
    parser.add_argument(
        "--kinds", default="small,tensor", help="payloads to run, comma separated (small,tensor)"
    )
    parser.add_argument("--pairs", default="1,4", help="pair counts to run, comma separated")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    counts = {"small": 300, "tensor": 60} if args.quick else {"small": 2000, "tensor": 300}
    repeats = 2 if args.quick else 3

    load_before = os.getloadavg()[0]
    cluster = Cluster(address="local")
    print(cluster.summary(), flush=True)
    try:
        kinds = [k for k in args.kinds.split(",") if k]
        if not kinds or set(kinds) - {"small", "tensor"}:
            parser.error(f"--kinds: got {args.kinds!r}; allowed: small, tensor")
        pairs_list = [int(p) for p in args.pairs.split(",") if p]
        rows = bench(cluster, counts, repeats, kinds, pairs_list)
    finally:
        cluster.shutdown()
    # Other work on the machine moves both sides; the ratios are what to compare.
    load = f"load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}",
        "load": load,
        "quick": args.quick,
        "counts": counts,
        "repeats": repeats,
        "rows": rows,
    }
    (args.out / "bench_channel.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "bench_channel.md").write_text(markdown(result))
    print(f"wrote {args.out / 'bench_channel.json'} and {args.out / 'bench_channel.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
