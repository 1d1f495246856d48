"""Benchmark p2p-compress: provider + pool path against the bare codec library call.

For each codec (lz4 acceleration 1, zstd level 1), payload kind and size, on the same
tensor in the same run:

* compress: ``plan_compression`` (acquire encoder, lease a pooled buffer, compress into
  it, keep or discard, release codec, release lease) against the bare library call
  returning ``bytes`` (``lz4.block.compress`` / ``ZstdCompressor(level).compress``);
* decompress: ``decompress_into_tensor`` straight into the preallocated target against
  the bare library call returning ``bytes`` followed by a copy into the target.

Timing: variants are interleaved round by round; each round times a loop of calls
long enough to measure, and the best round (lowest time per call) is kept. The clock
is the calling thread's CPU time by default (``--clock cpu``; every codec call here
runs on the calling thread), so time the process spends preempted by other load on a
shared machine does not count; ``--clock wall`` uses ``perf_counter``. Prints the table and the
ratios; ``--out DIR`` also writes ``compress.md`` and ``compress.json`` there.

Targets (issue 3): provider path >= 0.9x the bare library's compress throughput;
decompress-into-target faster than bare-decompress-then-copy.

    python benchmarks/bench_compress.py --quick
    python benchmarks/bench_compress.py --out bench-out
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lz4
import lz4.block
import numpy as np
import torch
import zstandard

from p2p_compress import (
    SYNTHETIC_KINDS,
    Lz4CodecConfig,
    TensorBufferPool,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodec,
    ZstdCodecConfig,
    decompress_into_tensor,
    make_synthetic_tensor,
    plan_compression,
)

KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = (64 * KIB, 1 * MIB, 64 * MIB)
QUICK_SIZES = (64 * KIB, 1 * MIB)


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


def best_per_call(
    variants: dict[str, Callable[[], object]],
    rounds: int,
    min_round_s: float,
    clock: Callable[[], float],
) -> dict[str, float]:
    """Seconds per call of each variant: best round, variants interleaved per round."""
    inner: dict[str, int] = {}
    for name, func in variants.items():
        func()  # warm up (first pool allocation, page faults)
        start = time.perf_counter()
        func()
        once = max(time.perf_counter() - start, 1e-7)
        inner[name] = max(1, min(2000, math.ceil(min_round_s / once)))
    best = dict.fromkeys(variants, math.inf)
    for _ in range(rounds):
        for name, func in variants.items():
            n = inner[name]
            start = clock()
            for _ in range(n):
                func()
            best[name] = min(best[name], (clock() - start) / n)
    return best


def uint8_numpy(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).numpy()


def bench_case(
    codec: str,
    kind: str,
    size: int,
    rounds: int,
    min_round_s: float,
    pool: TensorBufferPool,
    clock: Callable[[], float],
) -> dict[str, Any]:
    tensor = make_synthetic_tensor(kind, size)
    nbytes = tensor.numel() * tensor.element_size()
    src_np = uint8_numpy(tensor)
    target = torch.empty_like(tensor)
    target_np = uint8_numpy(target)
    if codec == "lz4":
        codec_cfg: Lz4CodecConfig | ZstdCodecConfig = Lz4CodecConfig(acceleration=1)

        def bare_compress() -> bytes:
            return lz4.block.compress(src_np, store_size=False)

        bare_blob = bare_compress()

        def bare_decompress() -> bytes:
            return lz4.block.decompress(bare_blob, uncompressed_size=nbytes)
    else:
        codec_cfg = ZstdCodecConfig(level=1, max_inflight=4)
        cctx = zstandard.ZstdCompressor(level=1)
        dctx = zstandard.ZstdDecompressor()

        def bare_compress() -> bytes:
            return cctx.compress(src_np)

        bare_blob = bare_compress()

        def bare_decompress() -> bytes:
            return dctx.decompress(bare_blob)

    config = TensorCompressionConfig(codec=codec_cfg, min_bytes=0, excluded_dtypes=())
    provider = TensorCodecProvider(config)

    def provider_compress() -> None:
        plan = plan_compression([tensor], config, provider, pool)
        plan.release_all()

    # A payload for the decode side even when the plan would keep the tensor raw.
    codec_obj = provider.acquire_encoder()
    assert codec_obj is not None
    bound = codec_obj.max_compressed_size(nbytes)
    assert bound is not None
    buffer = torch.empty(bound, dtype=torch.uint8)
    payload = buffer[: codec_obj.compress_into(tensor, buffer)]
    provider.release(codec_obj)
    plan = plan_compression([tensor], config, provider, pool)
    kept = plan.entries[0].compressed
    plan.release_all()

    def provider_decompress() -> None:
        decompress_into_tensor(provider.codec_id, payload, target, provider, timeout=None)

    def bare_decompress_copy() -> None:
        target_np[:] = np.frombuffer(bare_decompress(), dtype=np.uint8)

    times = best_per_call(
        {
            "provider_compress": provider_compress,
            "bare_compress": bare_compress,
            "provider_decompress": provider_decompress,
            "bare_decompress_copy": bare_decompress_copy,
            "bare_decompress": bare_decompress,
        },
        rounds,
        min_round_s,
        clock,
    )
    target_np[:] = 0
    provider_decompress()
    if not np.array_equal(target_np, src_np):
        raise SystemExit(f"round trip failed for {codec} {kind} {size}")
    mbps = {k: nbytes / v / 1e6 for k, v in times.items()}
    return {
        "codec": codec,
        "kind": kind,
        "size": size,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "ratio": nbytes / payload.numel(),
        "bare_ratio": nbytes / len(bare_blob),
        "kept_compressed": kept,
        "seconds_per_call": times,
        "mb_per_s": mbps,
        "compress_vs_bare": mbps["provider_compress"] / mbps["bare_compress"],
        "decompress_vs_bare_copy": mbps["provider_decompress"] / mbps["bare_decompress_copy"],
        "decompress_vs_bare": mbps["provider_decompress"] / mbps["bare_decompress"],
    }


def fmt_size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "| codec | payload | size | ratio | compress MB/s provider | bare | provider/bare "
        "| decompress MB/s into target | bare+copy | into/bare+copy | bare only |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        m = r["mb_per_s"]
        lines.append(
            f"| {r['codec']} | {r['kind']} | {fmt_size(r['size'])} | {r['ratio']:.2f} "
            f"| {m['provider_compress']:,.0f} | {m['bare_compress']:,.0f} "
            f"| {r['compress_vs_bare']:.2f}x "
            f"| {m['provider_decompress']:,.0f} | {m['bare_decompress_copy']:,.0f} "
            f"| {r['decompress_vs_bare_copy']:.2f}x | {m['bare_decompress']:,.0f} |"
        )
    s = meta["summary"]
    lines += [
        "",
        f"Compress, provider+pool vs bare: geometric mean {s['compress_geomean']:.2f}x, "
        f"min {s['compress_min']:.2f}x; {s['compress_meets']}/{len(results)} cases >= 0.9x.",
        f"Decompress into target vs bare decompress + copy: geometric mean "
        f"{s['decompress_geomean']:.2f}x, min {s['decompress_min']:.2f}x; "
        f"{s['decompress_meets']}/{len(results)} cases faster.",
        "",
        f"Machine: {meta['machine']}; torch {meta['torch']}, lz4 {meta['lz4']}, "
        f"zstandard {meta['zstandard']} (p2p zstd backend: {meta['zstd_backend']}); "
        f"clock: {meta['clock']} (best round); load average at start {meta['loadavg_start']}, "
        f"at end {meta['loadavg_end']}.",
        f"Command: `{meta['command']}`",
    ]
    return "\n".join(lines) + "\n"


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="directory for compress.md and compress.json")
    parser.add_argument("--quick", action="store_true", help="64 KiB and 1 MiB, fewer rounds")
    parser.add_argument("--codecs", default="lz4,zstd")
    parser.add_argument("--kinds", default=",".join(SYNTHETIC_KINDS))
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="thread CPU or wall")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    rounds = args.rounds or (5 if args.quick else 9)
    min_round_s = 0.005 if args.quick else 0.02
    kinds = [k for k in args.kinds.split(",") if k]
    codecs = [c for c in args.codecs.split(",") if c]
    pool = TensorBufferPool()
    loadavg_start = os.getloadavg()
    results = []
    for codec in codecs:
        for kind in kinds:
            for size in sizes:
                r = bench_case(codec, kind, size, rounds, min_round_s, pool, CLOCKS[args.clock])
                results.append(r)
                print(
                    f"{codec:4} {kind:16} {fmt_size(r['size']):>7} ratio {r['ratio']:7.2f}  "
                    f"compress {r['compress_vs_bare']:.2f}x bare  "
                    f"decompress {r['decompress_vs_bare_copy']:.2f}x bare+copy "
                    f"({r['decompress_vs_bare']:.2f}x bare alone)",
                    flush=True,
                )
    comp = [r["compress_vs_bare"] for r in results]
    dec = [r["decompress_vs_bare_copy"] for r in results]
    meta = {
        "command": " ".join(["python", "benchmarks/bench_compress.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
        "torch": torch.__version__,
        "lz4": lz4.__version__,
        "zstandard": zstandard.__version__,
        "zstd_backend": ZstdCodec().backend,
        "clock": args.clock,
        "loadavg_start": [round(x, 2) for x in loadavg_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "summary": {
            "compress_geomean": geomean(comp),
            "compress_min": min(comp),
            "compress_meets": sum(v >= 0.9 for v in comp),
            "decompress_geomean": geomean(dec),
            "decompress_min": min(dec),
            "decompress_meets": sum(v > 1.0 for v in dec),
        },
    }
    report = markdown(results, meta)
    print()
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compress.md").write_text(report)
        (args.out / "compress.json").write_text(
            json.dumps({"meta": meta, "results": results}, indent=2)
        )
        print(f"wrote {args.out / 'compress.md'} and {args.out / 'compress.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
