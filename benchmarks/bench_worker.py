"""p2p-worker costs against plain Ray, measured in the same run on an embedded cluster.

1. Group call overhead: a no-op method called on a WorkerGroup of 1, 2 and 8 workers
   (``group.noop().wait()``) against the same no-op on as many plain Ray actors
   (``ray.get([a.noop.remote() for a in actors])``). Ratio = group / plain latency.
2. Moving a CPU tensor between two workers: ``Worker.send`` / ``Worker.recv`` against
   passing the same tensor through Ray's object store between the same two actors
   (the sender ``ray.put``s it, the receiver ``ray.get``s it and reads it). Sizes 1 MiB
   to 128 MiB; ratio = object-store time / send time (above 1: send is faster).

It prints both tables and writes ``bench_worker.json`` and ``bench_worker.md`` into
``--out``. ``--quick`` runs fewer iterations and sizes (about a minute).

Usage: python benchmarks/bench_worker.py --out bench-out [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
import torch

from p2p_worker import Cluster, NodePlacementStrategy, PackedPlacementStrategy, Worker

MIB = 1 << 20


class NoOp(Worker):
    """A worker whose method does nothing: what is left is the call's cost."""

    def noop(self) -> None:
        """Do nothing."""
        return None


@ray.remote(num_cpus=0)
class PlainNoOp:
    """The baseline: a plain Ray actor with the same method."""

    def noop(self) -> None:
        """Do nothing."""
        return None


class Sender(Worker):
    """Sends tensors with Worker.send, or puts them in the object store."""

    def send_many(self, peer: str, nbytes: int, reps: int) -> float:
        """Send ``reps`` tensors of ``nbytes`` to rank 0 of ``peer``; return seconds."""
        tensor = torch.ones(nbytes // 4, dtype=torch.float32)
        self.send(0, peer, 0)  # handshake: both sides are in their loops
        start = time.perf_counter()
        for _ in range(reps):
            self.send(tensor, peer, 0)
        return time.perf_counter() - start

    def put_many(self, nbytes: int, reps: int) -> list[list[Any]]:
        """Put ``reps`` tensors of ``nbytes`` in the object store; return their refs."""
        tensor = torch.ones(nbytes // 4, dtype=torch.float32)
        return [[ray.put(tensor)] for _ in range(reps)]  # nested: the driver keeps refs


class Receiver(Worker):
    """Receives what Sender sends, either way, and reads it."""

    def recv_many(self, peer: str, reps: int) -> float:
        """Receive ``reps`` tensors from rank 0 of ``peer``; return seconds."""
        self.recv(peer, 0)  # handshake
        start = time.perf_counter()
        total = 0.0
        for _ in range(reps):
            got = self.recv(peer, 0)
            total += float(got[-1])
        end = time.perf_counter()
        if total != reps:
            raise AssertionError(f"received wrong data: {total} != {reps}")
        return end - start

    def get_many(self, wrapped: list[list[Any]]) -> float:
        """Get every wrapped ref from the object store; return seconds."""
        start = time.perf_counter()
        total = 0.0
        for (ref,) in wrapped:
            got = ray.get(ref)
            total += float(got[-1])
        end = time.perf_counter()
        if total != len(wrapped):
            raise AssertionError("received wrong data")
        return end - start


def timed_calls(call: Any, iterations: int) -> list[float]:
    for _ in range(max(3, iterations // 20)):  # warm up
        call()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def bench_calls(cluster: Cluster, sizes: list[int], iterations: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        group = NoOp.create_group().launch(
            cluster, PackedPlacementStrategy(n, cpus_per_worker=0), name=f"noop{n}"
        )
        actors = [PlainNoOp.remote() for _ in range(n)]  # type: ignore[attr-defined]
        ray.get([a.noop.remote() for a in actors])
        # Interleave the two so that load from elsewhere hits both alike.
        g_samples: list[float] = []
        p_samples: list[float] = []
        for _ in range(5):
            g_samples += timed_calls(lambda g=group: g.noop().wait(), iterations // 5)
            p_samples += timed_calls(
                lambda a=actors: ray.get([x.noop.remote() for x in a]), iterations // 5
            )
        group.shutdown()
        for a in actors:
            ray.kill(a)
        g_med, p_med = statistics.median(g_samples), statistics.median(p_samples)
        rows.append(
            {
                "workers": n,
                "group_us_median": g_med * 1e6,
                "group_us_mean": statistics.fmean(g_samples) * 1e6,
                "plain_us_median": p_med * 1e6,
                "plain_us_mean": statistics.fmean(p_samples) * 1e6,
                "ratio_median": g_med / p_med,
                "iterations": len(g_samples),
            }
        )
        print(
            f"  {n} worker(s): group {g_med * 1e6:8.0f} us   plain Ray {p_med * 1e6:8.0f} us"
            f"   ratio {g_med / p_med:5.2f}",
            flush=True,
        )
    return rows


def bench_transfer(cluster: Cluster, sizes_mib: list[int], budget_mib: int) -> list[dict[str, Any]]:
    one = NodePlacementStrategy([0], cpus_per_worker=0)
    snd = Sender.create_group().launch(cluster, one, name="bench_snd")
    rcv = Receiver.create_group().launch(cluster, one, name="bench_rcv")
    # Warm up both paths (process groups, object store) with a small message.
    h = snd.send_many("bench_rcv", MIB, 2)
    rcv.recv_many("bench_snd", 2).wait()
    h.wait()
    rcv.get_many(snd.put_many(MIB, 2).wait()[0]).wait()
    rows = []
    for mib in sizes_mib:
        nbytes = mib * MIB
        reps = max(3, min(32, budget_mib // mib))
        send_times, store_times = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            h = snd.send_many("bench_rcv", nbytes, reps)
            recv_s = rcv.recv_many("bench_snd", reps).wait()[0]
            h.wait()
            send_wall = time.perf_counter() - t0
            send_times.append((recv_s, send_wall))

            t0 = time.perf_counter()
            refs = snd.put_many(nbytes, reps).wait()[0]
            get_s = rcv.get_many(refs).wait()[0]
            store_wall = time.perf_counter() - t0
            del refs
            store_times.append((get_s, store_wall))
        # Per transfer: the whole round trip seen from the driver (put + get for the store,
        # send + recv for p2p), best of three rounds.
        send_s = min(w for _, w in send_times) / reps
        store_s = min(w for _, w in store_times) / reps
        rows.append(
            {
                "mib": mib,
                "reps": reps,
                "send_ms": send_s * 1e3,
                "send_gbps": nbytes / send_s / 1e9,
                "store_ms": store_s * 1e3,
                "store_gbps": nbytes / store_s / 1e9,
                "ratio_store_over_send": store_s / send_s,
            }
        )
        send_rate, store_rate = nbytes / send_s / 1e9, nbytes / store_s / 1e9
        print(
            f"  {mib:4d} MiB: Worker.send {send_s * 1e3:8.2f} ms ({send_rate:5.2f} GB/s)"
            f"   object store {store_s * 1e3:8.2f} ms ({store_rate:5.2f} GB/s)"
            f"   store/send {store_s / send_s:5.2f}",
            flush=True,
        )
    snd.shutdown()
    rcv.shutdown()
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# p2p-worker benchmark",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']}",
        "",
        "## Group call overhead (no-op method, per call)",
        "",
        "| workers | WorkerGroup median (us) | plain Ray actors median (us) | ratio |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for r in result["calls"]:
        lines.append(
            f"| {r['workers']} | {r['group_us_median']:.0f} | {r['plain_us_median']:.0f} "
            f"| {r['ratio_median']:.2f} |"
        )
    lines += [
        "",
        "## CPU tensor between two workers (per transfer)",
        "",
        "| size (MiB) | Worker.send (ms) | GB/s | object store (ms) | GB/s | store / send |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["transfer"]:
        lines.append(
            f"| {r['mib']} | {r['send_ms']:.2f} | {r['send_gbps']:.2f} | {r['store_ms']:.2f} "
            f"| {r['store_gbps']:.2f} | {r['ratio_store_over_send']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and sizes")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    iterations = 200 if args.quick else 1000
    sizes_mib = [1, 16, 128] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128]
    budget_mib = 256 if args.quick else 1024

    cluster = Cluster(address="local")
    print(cluster.summary(), flush=True)
    try:
        print("Group call overhead (no-op), median per call:", flush=True)
        calls = bench_calls(cluster, [1, 2, 8], iterations)
        print("CPU float32 tensor between two workers, per transfer:", flush=True)
        transfer = bench_transfer(cluster, sizes_mib, budget_mib)
    finally:
        cluster.shutdown()
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}",
        "quick": args.quick,
        "calls": calls,
        "transfer": transfer,
    }
    (args.out / "bench_worker.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "bench_worker.md").write_text(markdown(result))
    print(f"wrote {args.out / 'bench_worker.json'} and {args.out / 'bench_worker.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
