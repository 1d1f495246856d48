"""Benchmark p2p_worker.compat against Ray's own ray.util.collective (gloo), same actors.

For 2, 4 and 8 members (plain Ray actors on this machine, ``--quick``: 2 and 4) and
per-member tensors of 4 KiB to 64 MiB (``--quick``: 4 KiB, 1 MiB, 16 MiB), every
operation both libraries have -- allreduce, broadcast, reduce, allgather,
reducescatter, barrier, and send/recv between ranks 0 and 1 -- runs with the same code
through ``p2p_worker.compat`` and through ``ray.util.collective`` (backend
``"gloo"``, torch-gloo, no pygloo), in the same actors, alternating round by round so
both see the same machine load. Each member times ``reps`` back-to-back operations
after a barrier -- the same one, Ray's, before either library's turn, so both start
from the same skew between members (each library's own barrier leaves the members a
different distance apart, which the timed operations would then absorb); a round's
time is the slowest member's; the figure is the median round (best in the JSON). The
ratio is Ray's time over ours (> 1: ours is faster).

A send/recv turn starts with one untimed send/recv (either library alike): a barrier
releases its members at different moments, and rank 1, the receiver, may leave it
milliseconds before rank 0 sends; that wait, counted in the slowest member's time, is
the barrier's, not the transfer's. After the first message both run in step. Measured
with 8 actors on 2 cores: after a barrier the first of 8 timed 1 MiB receives took
5.4-6.4 ms, the other seven 0.14-0.4 ms; p2p's 1 MiB send/recv read 0.64 ms per
operation with that wait counted and 0.25 ms without (Ray's 2.95 and 0.96 ms, other
load).

Groups on one node run p2p's collectives over shared memory (two members: one pair;
more: a ring of pairs between neighbours; the JSON records ``p2p_transport``);
``P2P_RAYCOLL_RING=0`` in the environment keeps groups of three or more on gloo, the
earlier path, for a before/after comparison.

``--broadcast-kinds`` adds the earlier comparison of p2p's broadcast forms with a
loop of point-to-point sends (spawned processes, no Ray).

Usage:
    python benchmarks/bench_collectives.py --out bench-results [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

OPS = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter", "barrier", "send/recv")
LIBS = ("p2p", "ray")
KINDS = ("broadcast_tensor", "broadcast", "send loop")
ROUND_BYTES = 8 << 20  # a round moves about this much per member (at least one op)


def _reps(nbytes: int) -> int:
    return max(1, min(50, math.ceil(ROUND_BYTES / nbytes)))


class BenchMember:
    """One member: joins the p2p group "p2p" and Ray's group "ray"; times operations."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        import ray.util.collective as ray_col

        import p2p_worker.compat as p2p_col

        self.libs = {"p2p": p2p_col, "ray": ray_col}
        self.rank = -1
        self.n = 0

    def setup(self, n: int, rank: int) -> bool:
        """Join both groups as ``rank`` of ``n`` (every member at once)."""
        self.rank, self.n = rank, n
        for lib, col in self.libs.items():  # Ray's init blocks until every member came
            col.init_collective_group(n, rank, backend="gloo", group_name=lib)
        return True

    def _one(self, lib: str, op: str, bufs: dict[str, Any]) -> None:
        col, name, r = self.libs[lib], lib, self.rank
        t = bufs["t"]
        if op == "allreduce":
            col.allreduce(t, name)
        elif op == "broadcast":
            col.broadcast(t, 0, name)
        elif op == "reduce":
            col.reduce(t, 0, name)
        elif op == "allgather":
            col.allgather(bufs["list"], t, name)
        elif op == "reducescatter":
            col.reducescatter(bufs["out"], bufs["list"], name)
        elif op == "barrier":
            col.barrier(name)
        elif op == "send/recv":
            if r == 0:
                col.send(t, 1, name)
            elif r == 1:
                col.recv(t, 0, name)
        else:  # pragma: no cover - a typo in OPS
            raise ValueError(op)

    def run(self, op: str, nbytes: int, reps: int, rounds: int) -> dict[str, list[float]]:
        """Per library, the seconds of each round of ``reps`` operations (this member)."""
        numel = max(1, nbytes // 4)
        bufs = {
            "t": torch.ones(numel),
            "out": torch.zeros(numel),
            "list": [torch.ones(numel) for _ in range(self.n)]
            if op in ("allgather", "reducescatter")
            else [],
        }
        times: dict[str, list[float]] = {lib: [] for lib in LIBS}
        for i in range(rounds + 1):  # the first round warms up (connects) every path
            for lib in LIBS if i % 2 == 0 else LIBS[::-1]:
                self.libs["ray"].barrier("ray")  # one common start line (see module doc)
                if op == "send/recv":  # untimed: absorbs the start line's skew (module doc)
                    self._one(lib, op, bufs)
                t0 = time.perf_counter()
                for _ in range(reps):
                    self._one(lib, op, bufs)
                if i:
                    times[lib].append((time.perf_counter() - t0) / reps)
        return times

    def transport(self) -> str | None:
        """How p2p's collectives travel in this group (``"shm"`` or ``"gloo"``)."""
        handle = self.libs["p2p"].get_group_handle("p2p")
        return getattr(handle, "collectives_transport", "gloo")

    def close(self) -> None:
        """Leave both groups (after a barrier in each)."""
        for lib, col in self.libs.items():
            col.barrier(lib)
        for lib, col in self.libs.items():
            col.destroy_collective_group(lib)


def run_members(
    n: int, sizes: list[int], rounds: int, ops: tuple[str, ...] = OPS
) -> dict[str, Any]:
    """Every operation and size with ``n`` member actors; cell -> per-library figures."""
    import ray

    actor = ray.remote(num_cpus=0)(BenchMember)
    env = {"GLOO_SOCKET_IFNAME": "lo"} if _loopback() else {}
    members = [actor.options(runtime_env={"env_vars": env}).remote() for _ in range(n)]
    ray.get([m.setup.remote(n, r) for r, m in enumerate(members)], timeout=300)
    cells: dict[str, Any] = {}
    try:
        for op in ops:
            for nbytes in [4096] if op == "barrier" else sizes:
                reps = _reps(nbytes)
                per_member = ray.get(
                    [m.run.remote(op, nbytes, reps, rounds) for m in members], timeout=1800
                )
                cell: dict[str, Any] = {"reps": reps}
                for lib in LIBS:
                    slowest = [max(ts) for ts in zip(*(pm[lib] for pm in per_member), strict=True)]
                    cell[lib] = {"median": statistics.median(slowest), "best": min(slowest)}
                cell["ratio"] = cell["ray"]["median"] / cell["p2p"]["median"]
                cells[f"{op}|{nbytes}"] = cell
                print(_row(op, n, nbytes, cell), flush=True)
        cells["p2p_transport"] = ray.get(members[0].transport.remote(), timeout=60)
        ray.get([m.close.remote() for m in members], timeout=300)
    finally:
        for m in members:
            ray.kill(m)
    return cells


def _loopback() -> bool:
    import ray

    return str(ray.util.get_node_ip_address()) in ("127.0.0.1", "localhost")


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _row(op: str, n: int, nbytes: int, cell: dict[str, Any]) -> str:
    size = "-" if op == "barrier" else _size(nbytes)
    p2p, ray_ = cell["p2p"]["median"] * 1e3, cell["ray"]["median"] * 1e3
    return f"| {op} | {n} | {size} | {p2p:.3f} | {ray_:.3f} | {cell['ratio']:.2f} |"


def _cells(cells: dict[str, Any]) -> list[tuple[str, Any]]:
    """The timed cells (``"op|bytes"``), without the group's other records."""
    return [(k, c) for k, c in cells.items() if "|" in k]


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(results: dict[int, dict[str, Any]]) -> list[str]:
    """Geometric-mean ratio per operation, and the issue's targets checked."""
    lines = ["| operation | geometric mean of Ray / p2p | cells |", "|---|---|---|"]
    for op in OPS:
        ratios = [
            c["ratio"]
            for cells in results.values()
            for k, c in _cells(cells)
            if k.split("|")[0] == op
        ]
        lines.append(f"| {op} | {_geomean(ratios):.2f} | {len(ratios)} |")
    checks = []
    big = [
        c["ratio"]
        for cells in results.values()
        for k, c in _cells(cells)
        if k.startswith("send/recv|") and int(k.split("|")[1]) >= 1 << 20
    ]
    if big:
        checks.append(f"send/recv >= 1 MiB: worst {min(big):.2f}x (target >= 2x)")
    coll = [
        c["ratio"]
        for cells in results.values()
        for k, c in _cells(cells)
        if k.split("|")[0] not in ("send/recv", "barrier") and int(k.split("|")[1]) >= 1 << 20
    ]
    if coll:
        checks.append(f"collectives >= 1 MiB: worst {min(coll):.2f}x (target >= 1.0x)")
    small = [
        c["ratio"]
        for cells in results.values()
        for k, c in _cells(cells)
        if k.split("|")[0] == "barrier" or int(k.split("|")[1]) == 4096
    ]
    if small:
        checks.append(f"barrier and 4 KiB latency: worst {min(small):.2f}x (target >= 1.0x)")
    return lines + [""] + [f"* {c}" for c in checks]


def compare_with_ray(
    members: list[int], sizes: list[int], rounds: int, ops: tuple[str, ...] = OPS
) -> tuple[dict[int, Any], list[str]]:
    import ray

    started = False
    if not ray.is_initialized():
        tmp = os.environ.get("P2P_RAY_TMPDIR") or "/tmp/p2pray"
        os.makedirs(tmp, exist_ok=True)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            _temp_dir=tmp,
            include_dashboard=False,
            logging_level="WARNING",
        )
        started = True
    header = [
        "| operation | members | size per member | p2p (ms) | ray.util.collective (ms)"
        " | Ray / p2p |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(header), flush=True)
    results: dict[int, Any] = {}
    rows: list[str] = []
    try:
        for n in members:
            results[n] = run_members(n, sizes, rounds, ops)
            for key, cell in _cells(results[n]):
                op, nbytes = _split(key)
                rows.append(_row(op, n, nbytes, cell))
    finally:
        if started:
            ray.shutdown()
    return results, header + sorted(rows, key=lambda row: OPS.index(row.split(" | ")[0][2:]))


def _split(key: str) -> tuple[str, int]:
    op, nbytes = key.split("|")
    return op, int(nbytes)


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
    """p2p's broadcast forms and a send loop, ``n`` spawned processes (no Ray)."""
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


def broadcast_kinds(quick: bool) -> tuple[dict[str, Any], list[str]]:
    nbytes = (16 if quick else 64) << 20
    rounds = 2 if quick else 5
    results: dict[str, Any] = {"nbytes": nbytes, "rounds": rounds, "receivers": {}}
    lines = [
        f"## p2p broadcast forms vs a send loop, {nbytes >> 20} MiB (best / median s)",
        "",
        "| receivers | " + " | ".join(KINDS) + " | send loop / broadcast_tensor |",
        "|---|" + "---|" * (len(KINDS) + 1),
    ]
    for receivers in (1, 3) if quick else (1, 3, 7):
        times = run_size(receivers + 1, nbytes, rounds)
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        results["receivers"][receivers] = {"best": best, "median": med, "all": times}
        ratio = best["send loop"] / best["broadcast_tensor"]
        cells = " | ".join(f"{best[k]:.3f} / {med[k]:.3f}" for k in KINDS)
        lines.append(f"| {receivers} | {cells} | {ratio:.2f} |")
        print(lines[-1], flush=True)
    return results, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--quick", action="store_true", help="2 and 4 members, 3 sizes, 3 rounds")
    ap.add_argument("--members", default=None, help="comma-separated member counts")
    ap.add_argument("--sizes", default=None, help="comma-separated bytes per member")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--ops", default=None, help=f"comma-separated subset of {', '.join(OPS)}")
    ap.add_argument("--broadcast-kinds", action="store_true", help="add the broadcast-forms table")
    args = ap.parse_args()
    members = [2, 4] if args.quick else [2, 4, 8]
    sizes = (
        [4 << 10, 1 << 20, 16 << 20]
        if args.quick
        else [4 << 10, 256 << 10, 1 << 20, 16 << 20, 64 << 20]
    )
    if args.members:
        members = [int(x) for x in args.members.split(",")]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    rounds = args.rounds or (3 if args.quick else 5)
    ops = OPS if not args.ops else tuple(o for o in OPS if o in args.ops.split(","))
    started = time.time()
    results, table = compare_with_ray(members, sizes, rounds, ops)
    lines = [
        "# p2p_worker.compat vs ray.util.collective (gloo), same actors, same code",
        "",
        f"Median of {rounds} rounds; a round is the slowest member's time per operation.",
        "",
        *table,
        "",
        *summary(results),
        *[f"* p2p collectives, {n} members: {results[n].get('p2p_transport')}" for n in members],
    ]
    report: dict[str, Any] = {
        "members": members,
        "sizes": sizes,
        "rounds": rounds,
        "results": results,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "seconds": round(time.time() - started, 1),
    }
    if args.broadcast_kinds:
        report["broadcast_kinds"], more = broadcast_kinds(args.quick)
        lines += ["", *more]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_collectives.json").write_text(json.dumps(report, indent=2))
    (args.out / "bench_collectives.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
