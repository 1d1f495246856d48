"""Compression over a real shaped link: two Ray nodes in network namespaces, veth at 1 Gbit/s.

The veth between the namespaces is shaped with ``tc tbf`` (both directions). For int64
token ids and sparse float32 it measures the effective throughput (raw bytes delivered
per second, compression time included) of:

* ``gloo``: raw ``torch.distributed`` gloo send/recv between two Ray actors, one per node,
  with the payload compressed by hand (lz4 block / zstd level 1) or sent raw -- the
  baseline and what the link gives without p2p;
* ``p2p``: ``Worker.send`` / ``recv`` with ``tensor_compression`` raw, lz4 and zstd,
  and ``auto`` (the adaptive mode); 32 MiB tensors go as chunked frames (1 MiB chunks,
  compressed and sent as each is ready);
* ``p2p-emulated``: the same with the veth unshaped and the app-level link emulation
  ``cluster.net_emulation`` at the same bandwidth (needs issue 5's emulation).

It prints each mode's throughput against the tbf rate and against raw in the same run,
the agreement of the real shaped link with the emulation (target: within 15%), and
writes ``multinode.json`` and ``multinode.md`` into ``--out``.

The emulation models the link, so the comparison is judged only where the link is the
bottleneck: a cell whose wire rate over the shaped veth (wire bytes per second) stays
below :data:`LINK_BOUND` of the tbf rate is bound by the CPUs (compressing and decoding on a
small, shared host), and its shaped / emulated ratio compares two moments of the host's
load, not the link model; the table says so instead of judging it. To judge compressed
chunked frames on a small host, pick a ``--rate`` below what the codecs sustain there
(e.g. ``--rate 200mbit``) and a short run (``--kinds``, ``--codecs``). Run as root (it makes
network namespaces); elsewhere it writes a report saying why it did not run.

Usage: python benchmarks/bench_multinode.py --out bench-out [--size-mib 32] [--reps 6]
       [--rate 1gbit] [--kinds token_ids,sparse_f32] [--codecs raw,lz4,zstd,auto]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("token_ids", "sparse_f32")
GLOO_CODECS = ("raw", "lz4", "zstd")
CODECS = (*GLOO_CODECS, "auto")
"""``auto``: ``compression_pipeline.adaptive: true`` (raw, lz4, zstd or sparse per link)."""
LINK_BOUND = 0.85
"""A cell is link-bound when its wire rate reaches this share of the tbf rate."""


def make_tensor(kind: str, nbytes: int, seed: int = 0) -> Any:
    """int64 token ids uniform in a 32k vocabulary, or float32 with 90% zeros."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if kind == "token_ids":
        return torch.randint(0, 32000, (nbytes // 8,), dtype=torch.int64, generator=gen)
    data = torch.randn(nbytes // 4, generator=gen)
    data[torch.rand(data.numel(), generator=gen) < 0.9] = 0.0
    return data


# ---------------------------------------------------------------------------------------
# Driver side: runs inside the head namespace (``--driver MODE``), prints one JSON line.
# ---------------------------------------------------------------------------------------


def _gloo_driver(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    class GlooPeer:
        def free_port(self) -> int:
            import socket

            with socket.socket() as s:
                s.bind((os.environ["P2PMN_HEAD_IP"], 0))
                return int(s.getsockname()[1])

        def run(self, rank: int, port: int, nbytes: int, reps: int) -> list[dict[str, Any]]:
            import datetime

            import lz4.block
            import torch
            import torch.distributed as dist
            import zstandard

            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["P2PMN_IFNAME"]
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://{os.environ['P2PMN_HEAD_IP']}:{port}",
                rank=rank,
                world_size=2,
                timeout=datetime.timedelta(seconds=120),
            )
            cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
            out = []
            for kind in KINDS:
                src = make_tensor(kind, nbytes)
                raw = src.view(torch.uint8).numpy()
                for codec in GLOO_CODECS:
                    dist.barrier()
                    start = time.perf_counter()
                    wire = 0
                    for _ in range(reps):
                        if rank == 0:
                            if codec == "raw":
                                payload = src.view(torch.uint8)
                            elif codec == "lz4":
                                payload = torch.frombuffer(
                                    bytearray(lz4.block.compress(raw, store_size=False)),
                                    dtype=torch.uint8,
                                )
                            else:
                                payload = torch.frombuffer(
                                    bytearray(cctx.compress(raw)), dtype=torch.uint8
                                )
                            dist.send(torch.tensor([payload.numel()]), 1)
                            dist.send(payload, 1)
                            wire += payload.numel()
                        else:
                            size = torch.zeros(1, dtype=torch.int64)
                            dist.recv(size, 0)
                            payload = torch.empty(int(size), dtype=torch.uint8)
                            dist.recv(payload, 0)
                            if codec == "lz4":
                                lz4.block.decompress(payload.numpy(), uncompressed_size=nbytes)
                            elif codec == "zstd":
                                dctx.decompress(payload.numpy(), max_output_size=nbytes)
                    dist.barrier()
                    seconds = (time.perf_counter() - start) / reps
                    out.append(
                        {"kind": kind, "codec": codec, "seconds": seconds, "wire": wire // reps}
                    )
            dist.destroy_process_group()
            return out

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeManagerAddress"])
    peers = [
        GlooPeer.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in nodes
    ]
    port = ray.get(peers[0].free_port.remote())
    nbytes = args.size_mib * 1024**2
    res = ray.get([p.run.remote(r, port, nbytes, args.reps) for r, p in enumerate(peers)])
    rows = res[0]
    for row, other in zip(rows, res[1], strict=True):
        row["seconds"] = max(row["seconds"], other["seconds"])
        row["raw"] = nbytes
    return {"rows": rows}


def _p2p_driver(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from p2p_worker import Cluster, NodePlacementStrategy, Worker

    class Sender(Worker):
        def run(self, kind: str, nbytes: int, reps: int) -> None:
            src = make_tensor(kind, nbytes)
            self.send(torch.zeros(1), dst_group_name="bn_recv", dst_rank=0)  # warm up
            for _ in range(reps):
                self.send(src, dst_group_name="bn_recv", dst_rank=0)

    class Receiver(Worker):
        def run(self, kind: str, nbytes: int, reps: int) -> dict[str, float]:
            self.recv(src_group_name="bn_send", src_rank=0)
            group = self.collective.create_collective_group(
                [self.worker_address.get_name(), "bn_send:0"]
            )
            wire0 = group.stats()["recv"]["wire_bytes"]
            start = time.perf_counter()
            for _ in range(reps):
                out = self.recv(src_group_name="bn_send", src_rank=0)
            seconds = (time.perf_counter() - start) / reps
            wire = (group.stats()["recv"]["wire_bytes"] - wire0) / reps
            if not torch.equal(out, make_tensor(kind, nbytes)):
                raise AssertionError(f"{kind}: received tensor differs")
            return {"seconds": seconds, "wire": wire}

    config = json.loads(args.config)
    cluster = Cluster(num_nodes=2, config=config)
    place = [NodePlacementStrategy([r], cpus_per_worker=0) for r in (0, 1)]
    send = Sender.create_group().launch(cluster, placement_strategy=place[0], name="bn_send")
    recv = Receiver.create_group().launch(cluster, placement_strategy=place[1], name="bn_recv")
    nbytes = args.size_mib * 1024**2
    rows = []
    for kind in args.kinds:
        s, r = send.run(kind, nbytes, args.reps), recv.run(kind, nbytes, args.reps)
        s.wait()
        rows.append({"kind": kind, "raw": nbytes, **r.wait()[0]})
    cluster.shutdown(timeout=60)
    return {"rows": rows}


def p2p_config(codec: str, emulate_mbps: float | None) -> dict[str, Any]:
    """The ``cluster`` config of one p2p run (compression codec, optional link emulation)."""
    collective: dict[str, Any] = {}
    if codec != "raw":
        collective["tensor_compression"] = {
            "enabled": True,
            "codec": "zstd" if codec == "auto" else codec,
            "min_bytes": 16384,
            "excluded_dtypes": [],  # let float32 in: sparse float32 is one of the kinds
        }
    if codec == "auto":
        collective["compression_pipeline"] = {"adaptive": True}
    cluster: dict[str, Any] = {"collective": collective}
    if emulate_mbps is not None:
        cluster["net_emulation"] = {"enabled": True, "bandwidth_mbps": emulate_mbps}
    return {"cluster": cluster}


def p2p_missing() -> str | None:
    """Why the p2p modes cannot run yet, or None."""
    try:
        import p2p_worker
    except ImportError as exc:
        return f"p2p_worker not importable ({exc})"
    missing = [
        n for n in ("Cluster", "Worker", "NodePlacementStrategy") if not hasattr(p2p_worker, n)
    ]
    return f"p2p_worker lacks {missing} (issue 6)" if missing else None


def emulation_missing() -> str | None:
    """Why the app-level link emulation cannot be compared yet, or None."""
    try:
        from p2p_collective import parse_collective_config
    except ImportError as exc:
        return f"p2p_collective has no parse_collective_config ({exc})"
    try:
        cfg = parse_collective_config(None)
    except Exception as exc:
        return f"parse_collective_config(None) failed: {exc}"
    return None if hasattr(cfg, "net_emulation") else "no net_emulation in CollectiveConfig"


# ---------------------------------------------------------------------------------------
# Controller side: makes the cluster, shapes the link, runs the drivers, writes the report.
# ---------------------------------------------------------------------------------------


def _load_harness() -> Any:
    spec = importlib.util.spec_from_file_location(
        "netns_cluster", ROOT / "tools" / "netns_cluster.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["netns_cluster"] = module
    spec.loader.exec_module(module)
    return module


def _driver(cluster: Any, args: argparse.Namespace, mode: str, config: Any = None) -> Any:
    argv = [str(Path(__file__).resolve()), "--driver", mode, "--size-mib", str(args.size_mib)]
    argv += ["--reps", str(args.reps), "--config", json.dumps(config)]
    argv += ["--kinds", ",".join(args.kinds), "--codecs", ",".join(args.codecs)]
    return cluster.run_driver(argv, timeout=600).check()


def _mbps(row: dict[str, Any]) -> float:
    return float(row["raw"]) * 8 / row["seconds"] / 1e6


def _wire_mbps(row: dict[str, Any]) -> float:
    return float(row.get("wire", row["raw"])) * 8 / row["seconds"] / 1e6


def judge(shaped: dict[str, Any], emulated: dict[str, Any], rate_mbps: float) -> str:
    """The comparison cell of one (data, codec): within 15%, or why it is not judged."""
    ratio = _mbps(shaped) / _mbps(emulated)
    load = _wire_mbps(shaped) / rate_mbps
    if load < LINK_BOUND:  # the real link was not the bottleneck: nothing to model
        return (
            f"not judged: CPU-bound (the shaped link's wire at {load:.0%} of its rate),"
            " compares the host's load"
        )
    return str(abs(ratio - 1) <= 0.15)


def run_all(args: argparse.Namespace, harness: Any) -> dict[str, Any]:
    cluster = harness.NetnsCluster(tag=f"b{os.getpid()}")
    report: dict[str, Any] = {"rate": args.rate, "size_mib": args.size_mib, "reps": args.reps}
    report["notes"] = []
    cluster.up(timeout=180)
    try:
        rate = cluster.shape(args.rate)
        report["rate_mbps"] = rate / 1e6
        report["gloo"] = _driver(cluster, args, "gloo")["rows"]
        why = p2p_missing()
        if why:
            report["notes"].append(f"p2p modes not run: {why}")
            return report
        report["p2p"] = []
        why = emulation_missing()
        if why:
            report["notes"].append(f"emulated link not compared: {why}")
        else:
            report["p2p_emulated"] = []
        # Shaped and emulated runs of one codec back to back (the veth shaped, then
        # unshaped): on a shared host the load drifts, and only neighbours compare.
        for codec in args.codecs:
            cluster.shape(args.rate)
            for row in _driver(cluster, args, "p2p", p2p_config(codec, None))["rows"]:
                report["p2p"].append({**row, "codec": codec})
            if why is None:
                cluster.unshape()
                config = p2p_config(codec, rate / 1e6)
                for row in _driver(cluster, args, "p2p", config)["rows"]:
                    report["p2p_emulated"].append({**row, "codec": codec})
        coded = [r for r in report["p2p"] if r["codec"] != "raw"]
        if coded and all(r["wire"] >= 0.98 * r["raw"] for r in coded):
            report["notes"].append(
                "p2p lz4/zstd rows moved raw bytes (wire/raw = 1): tensor_compression is "
                "parsed but not applied on the wire yet (issue 5)"
            )
        if why is not None:
            return report
        raw_emu = [r for r in report["p2p_emulated"] if r["codec"] == "raw"]
        if any(_mbps(r) > 1.5 * rate / 1e6 for r in raw_emu):
            report["emulation_applied"] = False
            report["notes"].append(
                "net_emulation is parsed but does not pace the sender yet (issue 5): raw "
                "transfers ran at the unshaped veth's speed, so no comparison is made"
            )
    finally:
        cluster.down()
    return report


def render(report: dict[str, Any]) -> str:
    """The Markdown table of one run (also printed)."""
    lines = [
        f"Link: veth shaped with tc tbf at {report['rate']} (both directions); "
        f"{report['size_mib']} MiB tensors, {report['reps']} repetitions, effective "
        f"throughput = raw bytes / time (compression included).",
        "",
        "| mode | data | codec | Mbit/s | x tbf rate | x raw (same mode) | wire/raw |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rate = report.get("rate_mbps", 0.0)
    for mode in ("gloo", "p2p", "p2p_emulated"):
        rows = report.get(mode) or []
        raw = {r["kind"]: _mbps(r) for r in rows if r["codec"] == "raw"}
        for r in rows:
            wire = f"{r['wire'] / r['raw']:.2f}" if "wire" in r else "-"
            lines.append(
                f"| {mode} | {r['kind']} | {r['codec']} | {_mbps(r):.0f} | {_mbps(r) / rate:.2f} | "
                f"{_mbps(r) / raw[r['kind']]:.2f} | {wire} |"
            )
    if report.get("p2p") and report.get("p2p_emulated") and report.get("emulation_applied", True):
        lines += [
            "",
            "| data | codec | shaped veth / emulated | within 15% |",
            "| --- | --- | --- | --- |",
        ]
        emu = {(r["kind"], r["codec"]): r for r in report["p2p_emulated"]}
        for r in report["p2p"]:
            other = emu[(r["kind"], r["codec"])]
            ratio = _mbps(r) / _mbps(other)
            verdict = judge(r, other, rate)
            lines.append(f"| {r['kind']} | {r['codec']} | {ratio:.2f} | {verdict} |")
    lines += [""] + [f"- {n}" for n in report.get("notes", [])]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    parser.add_argument("--size-mib", type=int, default=32)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--rate", default="1gbit", help="tc tbf rate (default 1gbit)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--codecs", default=",".join(CODECS), help=f"of {', '.join(CODECS)}")
    parser.add_argument("--driver", choices=("gloo", "p2p"), help=argparse.SUPPRESS)
    parser.add_argument("--config", default="null", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.codecs = [c for c in args.codecs.split(",") if c]
    for name, got, allowed in (("kinds", args.kinds, KINDS), ("codecs", args.codecs, CODECS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            parser.error(f"--{name}: got {bad or got}; allowed: {', '.join(allowed)}")
    if args.driver:
        result = _gloo_driver(args) if args.driver == "gloo" else _p2p_driver(args)
        print("P2PMN-RESULT " + json.dumps(result), flush=True)
        return 0
    harness = _load_harness()
    args.out.mkdir(parents=True, exist_ok=True)
    reason = harness.check_support()
    if reason:
        report: dict[str, Any] = {"skipped": f"cannot create network namespaces here: {reason}"}
        text = f"bench_multinode skipped: {report['skipped']}\n"
    else:
        started = time.time()
        report = run_all(args, harness)
        report["seconds"] = time.time() - started
        text = render(report)
    (args.out / "multinode.json").write_text(json.dumps(report, indent=2))
    (args.out / "multinode.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
