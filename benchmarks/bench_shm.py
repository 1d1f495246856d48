"""Benchmark the same-node shared-memory path against gloo and Ray's object store.

Two plain Ray actors on one embedded local cluster move CPU tensors of 128 MiB and
1 GiB from one to the other, in the same run, three ways; the receiver owns the result
in all three:

* ``shm``: ``CollectiveGroup.send_tensor`` / ``recv_tensor`` into a preallocated tensor,
  config ``shared_memory: true`` (the group's stats must say ``transport == "shm"``);
* ``gloo``: the same calls with ``shared_memory: false``;
* ``ray``: the sender ``ray.put``s the tensor's numpy array, the receiver ``ray.get``s
  it and copies it into its own preallocated tensor (time = put + get + copy).

A single-core memcpy (numpy copy between two warm buffers) is measured in the same run;
each path is reported in GB/s, as a fraction of that memcpy, and as ratios shm / gloo and
shm / ray. Rounds alternate the three ways so they see the same machine load; the
table holds the median over rounds (best in brackets). Results go to ``--out``.

Usage:
    python benchmarks/bench_shm.py --out bench-results [--quick]
"""

from __future__ import annotations

import argparse
import datetime
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

import numpy as np
import ray
import torch
import torch.distributed as dist

from p2p_worker import Cluster

MiB = 1 << 20
GiB = 1 << 30


@ray.remote(num_cpus=0)
class Peer:
    """One end: a Collective per config, and the Ray object-store side."""

    def __init__(self, rank: int, store_port: int) -> None:
        self.rank = rank
        self.store = dist.TCPStore(
            "127.0.0.1", store_port, is_master=False, timeout=datetime.timedelta(seconds=120)
        )
        self.groups: dict[str, Any] = {}
        self.colls: list[Any] = []
        self.buf: torch.Tensor | None = None

    def _group(self, shm: bool) -> Any:
        from p2p_collective import Collective, CollectiveConfig

        key = "shm" if shm else "gloo"
        if key not in self.groups:
            names = [f"{key}-0", f"{key}-1"]
            coll = Collective(
                names[self.rank], self.store, config=CollectiveConfig(shared_memory=shm)
            )
            self.colls.append(coll)
            self.groups[key] = coll.create_collective_group(names)
        return self.groups[key]

    def _tensor(self, nbytes: int) -> torch.Tensor:
        if self.buf is None or self.buf.numel() != nbytes:
            self.buf = None
            self.buf = torch.full((nbytes,), 7 if self.rank == 0 else 0, dtype=torch.uint8)
        return self.buf

    def p2p(self, shm: bool, nbytes: int, reps: int) -> tuple[float, str]:
        """Send (rank 0) or receive (rank 1) ``reps`` tensors after one warm-up transfer.

        Returns the receiver's seconds for the ``reps`` transfers (0 on the sender) and
        the direction's transport.
        """
        g = self._group(shm)
        t = self._tensor(nbytes)
        if self.rank == 0:
            for _ in range(reps + 1):
                g.send_tensor(t, timeout=600)
            g.recv(timeout=600)
            return 0.0, str(g.stats()["send"]["transport"])
        g.recv_tensor(t, timeout=600)
        start = time.perf_counter()
        for _ in range(reps):
            g.recv_tensor(t, timeout=600)
        elapsed = time.perf_counter() - start
        g.send("done", timeout=600)
        if int(t[-1]) != 7:
            raise AssertionError("wrong data received")
        t.fill_(0)
        return elapsed, str(g.stats()["recv"]["transport"])

    def put(self, nbytes: int) -> tuple[list[Any], float]:
        """Put the tensor's numpy array in the object store; (wrapped ref, seconds)."""
        arr = self._tensor(nbytes).numpy()
        start = time.perf_counter()
        ref = ray.put(arr)
        return [ref], time.perf_counter() - start

    def get(self, wrapped: list[Any], nbytes: int) -> float:
        """Get the array and copy it into this actor's own tensor; seconds."""
        dst = self._tensor(nbytes)
        start = time.perf_counter()
        arr = ray.get(wrapped[0])
        np.copyto(dst.numpy(), arr)
        elapsed = time.perf_counter() - start
        del arr
        if int(dst[-1]) != 7:
            raise AssertionError("wrong data received")
        dst.fill_(0)
        return elapsed

    def close(self) -> None:
        """Close the Collectives."""
        for c in self.colls:
            c.close()


def memcpy_gbps(nbytes: int, reps: int) -> float:
    """Single-core copy bandwidth between two warm buffers (best of ``reps``)."""
    a = np.full(nbytes, 3, dtype=np.uint8)
    b = np.zeros(nbytes, dtype=np.uint8)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def run(peers: list[Any], nbytes: int, reps: int, rounds: int) -> dict[str, Any]:
    res: dict[str, list[float]] = {"shm": [], "gloo": [], "ray": []}
    for _ in range(rounds):
        for kind in ("shm", "gloo"):
            _, (secs, transport) = ray.get(
                [p.p2p.remote(kind == "shm", nbytes, reps) for p in peers]
            )
            if transport != kind:
                raise AssertionError(f"{kind} run used transport {transport!r}")
            res[kind].append(nbytes * reps / secs / 1e9)
        total = 0.0
        for _ in range(reps):
            wrapped, put_s = ray.get(peers[0].put.remote(nbytes))
            total += put_s + ray.get(peers[1].get.remote(wrapped, nbytes))
            del wrapped
        res["ray"].append(nbytes * reps / total / 1e9)
    return {k: {"median": statistics.median(v), "best": max(v), "all": v} for k, v in res.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output dir")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per size")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds or (2 if args.quick else 3)
    plan = [(128 * MiB, 4 if args.quick else 8), (GiB, 1 if args.quick else 2)]

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    cluster = Cluster(address="local")
    peers = [Peer.remote(r, store.port) for r in range(2)]
    rows = []
    try:
        for nbytes, reps in plan:
            copy = memcpy_gbps(min(nbytes, 256 * MiB), 5)
            got = run(peers, nbytes, reps, rounds)
            row = {
                "mib": nbytes // MiB,
                "memcpy_gbps": copy,
                **{f"{k}_gbps": v["median"] for k, v in got.items()},
                **{f"{k}_best_gbps": v["best"] for k, v in got.items()},
                "shm_over_gloo": got["shm"]["median"] / got["gloo"]["median"],
                "shm_over_ray": got["shm"]["median"] / got["ray"]["median"],
                "shm_fraction_of_memcpy": got["shm"]["median"] / copy,
                "rounds": got,
            }
            rows.append(row)
            print(
                f"{row['mib']:>5} MiB: shm {row['shm_gbps']:.2f} GB/s"
                f" [{row['shm_best_gbps']:.2f}]  gloo {row['gloo_gbps']:.2f}"
                f" [{row['gloo_best_gbps']:.2f}]  ray {row['ray_gbps']:.2f}"
                f" [{row['ray_best_gbps']:.2f}]  memcpy(1 core) {copy:.2f}"
                f"  | shm/gloo {row['shm_over_gloo']:.2f}x  shm/ray {row['shm_over_ray']:.2f}x"
                f"  shm/memcpy {row['shm_fraction_of_memcpy']:.2f}",
                flush=True,
            )
        ray.get([p.close.remote() for p in peers])
    finally:
        cluster.shutdown()
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}",
        "rows": rows,
    }
    (args.out / "bench_shm.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| size (MiB) | shm GB/s | gloo GB/s | ray GB/s | memcpy GB/s | shm/gloo | shm/ray |"
        " shm/memcpy |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['mib']} | {r['shm_gbps']:.2f} | {r['gloo_gbps']:.2f} | {r['ray_gbps']:.2f}"
            f" | {r['memcpy_gbps']:.2f} | {r['shm_over_gloo']:.2f} | {r['shm_over_ray']:.2f}"
            f" | {r['shm_fraction_of_memcpy']:.2f} |"
        )
    (args.out / "bench_shm.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'bench_shm.json'} and {args.out / 'bench_shm.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
