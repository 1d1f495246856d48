"""CPU and context switches per item of a channel's small-item path (diagnostics).

Runs rounds of ``bench_channel.py``'s methods (``--methods``, default the blocking
``p2p``; with ``--ray`` also the Ray queue) with ``--pairs`` producer/consumer pairs and
reads ``/proc`` before and after each round: utime+stime of every process (the channel
worker, producers, consumers) and the voluntary / involuntary context switches of all
their threads, per item moved. ``THREADS=1`` adds CPU per thread (names from ``py-spy
dump``); ``--spy N`` records the ``--spy-role`` process with py-spy for N seconds
(``SPY_GIL=1``: only samples holding the GIL; ``SPY_RATE``). A round that takes longer
than ``HANG_AFTER`` seconds (180) prints the channel's counters, again 20 s later (moved
items mean a slow round, not a hang: under a load average of 15 on 2 cores one 4-pair
round of 1000 items took 75-114 s), and every stack, then exits. Needs Linux; py-spy for
the thread names and profiles (``pip install py-spy``).

Usage: python benchmarks/cpu_per_item.py [--pairs 4] [--items 1500] [--rounds 3] [--ray]
    [--methods p2p,p2p async] [--spy SECONDS] [--spy-role Consumer]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

sys.path.insert(0, str(Path(__file__).parent))

import ray
from bench_channel import MAXSIZE, Consumer, Producer, run_round
from ray.util.queue import Queue

from p2p_worker import Cluster, PackedPlacementStrategy, create_channel

HANG_AFTER = float(os.environ.get("HANG_AFTER", "180"))
STATE: Any = None
THREADS = bool(os.environ.get("THREADS"))
TICK = os.sysconf("SC_CLK_TCK")
ROLES = ("ChannelWorker", "Producer", "Consumer", "_QueueActor")


def find_pids() -> dict[str, list[int]]:
    """Pids of the Ray worker processes by role (from their ``ray::Class`` titles)."""
    found: dict[str, list[int]] = {r: [] for r in ROLES}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        for role in ROLES:
            if cmd.startswith(f"ray::{role}"):
                found[role].append(int(entry))
    found["driver"] = [os.getpid()]
    return {
        role: [p for p in ps if p != os.getpid() or role == "driver"] for role, ps in found.items()
    }


def _tasks(pid: int) -> list[str]:
    """Thread ids of ``pid`` (none once it has exited)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _cpu_seconds(stat: str) -> float:
    """User + system CPU seconds in the ``/proc/.../stat`` file ``stat`` (OSError if gone)."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sample(pid: int) -> tuple[float, int, int]:
    """(cpu seconds, voluntary, involuntary context switches over all threads) of ``pid``."""
    try:
        cpu = _cpu_seconds(f"/proc/{pid}/stat")
    except OSError:  # exited meanwhile
        return 0.0, 0, 0
    vol = inv = 0
    for tid in _tasks(pid):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                inv += int(line.split()[1])
    return cpu, vol, inv


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of ``pid``."""
    out = {}
    for tid in _tasks(pid):
        try:
            out[int(tid)] = _cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id (py-spy dump); group names reduced to their kind."""
    spy = str(Path(sys.executable).parent / "py-spy")
    try:
        got = subprocess.run(
            [spy, "dump", "-p", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        threads = json.loads(got)
    except Exception:
        return {}
    names = {}
    for t in threads:
        name = t.get("thread_name") or "?"
        name = re.sub(r"p2p\[p2pch\.[0-9a-f]+\.(\w+):\d+\.\d+(\.ctl)?\]", r"ch[\1\2]", name)
        name = re.sub(r"p2p\[.*\]", "p2p[group]", name)
        names[int(t.get("os_thread_id") or t["thread_id"])] = name
    return names


def measure(pids: dict[str, list[int]], fn: Any, items: int) -> dict[str, tuple[float, ...]]:
    before = {p: sample(p) for ps in pids.values() for p in ps}
    tbefore = {p: thread_cpu(p) for ps in pids.values() for p in ps}
    t0 = time.perf_counter()
    runner = threading.Thread(target=fn, daemon=True)
    runner.start()
    runner.join(HANG_AFTER)
    if runner.is_alive():  # report a hang: the channel's counters and every stack
        first = STATE()
        print("HANG? channel state:", first, flush=True)
        time.sleep(20)
        later = STATE()
        moved = later["gets"] - first["gets"]
        verdict = f"{moved} items moved: a slow round" if moved else "nothing moved: a hang"
        print(f"20 s later: {verdict}; channel state: {later}", flush=True)
        spy = str(Path(sys.executable).parent / "py-spy")
        for role, ps in pids.items():
            for p in ps:
                print(f"=== {role} {p}", flush=True)
                subprocess.run([spy, "dump", "-p", str(p)], check=False)
        os._exit(3)
    wall = time.perf_counter() - t0
    after = {p: sample(p) for ps in pids.values() for p in ps}
    tafter = {p: thread_cpu(p) for ps in pids.values() for p in ps}
    if THREADS:
        for role, ps in pids.items():
            per: dict[str, float] = {}
            for p in ps:
                names = thread_names(p)
                for tid, cpu in tafter[p].items():
                    name = names.get(tid, f"native/{'main' if tid == p else 'other'}")
                    per[name] = per.get(name, 0.0) + cpu - tbefore[p].get(tid, 0.0)
            ranked = sorted(per.items(), key=lambda kv: -kv[1])
            shown = ", ".join(f"{k}={v / items * 1e6:.0f}" for k, v in ranked if v)
            print(f"  threads {role}: {shown}")
    out: dict[str, tuple[float, ...]] = {}
    for role, ps in pids.items():
        if not ps:
            continue
        cpu = sum(after[p][0] - before[p][0] for p in ps)
        vol = sum(after[p][1] - before[p][1] for p in ps)
        inv = sum(after[p][2] - before[p][2] for p in ps)
        out[role] = (cpu / items * 1e6, vol / items, inv / items)
    out["wall"] = (wall, items / wall)
    return out


def report(label: str, res: dict[str, tuple[float, ...]]) -> None:
    wall, rate = res.pop("wall")
    total = sum(v[0] for v in res.values())
    print(f"{label}: {rate:.0f} items/s ({wall:.2f} s), load {os.getloadavg()[0]:.2f}")
    for role, (us, vol, inv) in res.items():
        print(f"    {role:14s} {us:7.0f} us CPU/item  {vol:6.2f} vol  {inv:5.2f} invol cs/item")
    print(f"    {'total':14s} {total:7.0f} us CPU/item")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--items", type=int, default=1500, help="items per producer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also measure ray.util.queue")
    parser.add_argument("--methods", default="p2p", help="bench_channel methods, comma separated")
    parser.add_argument("--spy", type=int, default=0, help="py-spy seconds (channel worker)")
    parser.add_argument("--spy-out", default="/tmp/chan_spy")
    parser.add_argument("--spy-role", default="ChannelWorker")
    args = parser.parse_args()
    cluster = Cluster(address="local")
    try:
        strategy = PackedPlacementStrategy(args.pairs, cpus_per_worker=0)
        producers = Producer.create_group().launch(cluster, strategy, name="cprod")
        consumers = Consumer.create_group().launch(cluster, strategy, name="ccons")
        channel = create_channel(cluster, "cpu_probe", maxsize=MAXSIZE)
        global STATE
        STATE = channel.stats
        targets: dict[str, Any] = {m: "cpu_probe" for m in args.methods.split(",")}
        if args.ray:
            targets["ray queue"] = Queue(maxsize=MAXSIZE, actor_options={"num_cpus": 0})
        n = args.items
        for method, target in targets.items():
            run_round(producers, consumers, args.pairs, method, target, "small", 200)
        pids = find_pids()
        print({r: len(p) for r, p in pids.items()}, flush=True)
        for _ in range(args.rounds):
            for method, target in targets.items():
                res = measure(
                    pids,
                    lambda m=method, t=target: run_round(
                        producers, consumers, args.pairs, m, t, "small", n
                    ),
                    n * args.pairs,
                )
                report(method, res)
                if method.startswith("p2p"):
                    st = channel.stats()
                    print("   stats", {k: v for k, v in st.items() if isinstance(v, int)})
        if args.spy:
            pid = pids[args.spy_role][0]
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-p",
                    str(pid),
                    "-d",
                    str(args.spy),
                    "-f",
                    "raw",
                    "-o",
                    f"{args.spy_out}_{args.spy_role}.txt",
                    "--threads",
                    "-r",
                    os.environ.get("SPY_RATE", "100"),
                    "--nonblocking",
                    *(["--gil"] if os.environ.get("SPY_GIL") else []),
                ]
            )
            while spy.poll() is None:
                run_round(producers, consumers, args.pairs, "p2p", "cpu_probe", "small", n)
            print("py-spy rc", spy.wait())
    finally:
        cluster.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
