"""Byte planes: p2p-compress's shuffle and unshuffle against the plain strided copy.

Chunked frames byte-shuffle 2-, 4- and 8-byte elements before compressing them, and
delta patches keep dense bodies in byte planes; the receiver pays the way back on every
chunk. For 10 MiB of random bytes per element size this times, best of 7 on one
thread, the strided numpy copy (``planes[...] = elements.reshape(-1, s).T`` and back,
the baseline, in this process) and ``p2p_compress.shuffle_bytes`` /
``unshuffle_bytes``, checks that both give the same bytes, and prints the ratios.

    python benchmarks/bench_byte_planes.py [--mib 10]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from p2p_compress import shuffle_bytes, unshuffle_bytes


def best_ms(fn: Callable[[], object], repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=10, help="bytes per element size (MiB)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n = args.mib << 20
    rng = np.random.default_rng(0)
    src = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    print(f"{args.mib} MiB, one thread, best of 7 (ms; ratio = strided / p2p)")
    cols = ["element", "shuffle strided", "shuffle p2p", "ratio"]
    cols += ["unshuffle strided", "unshuffle p2p", "ratio"]
    print("| " + " | ".join(cols) + " |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in (2, 4, 8):
        planes = torch.empty(n, dtype=torch.uint8)
        ref = np.empty(n, dtype=np.uint8)
        back = torch.empty(n, dtype=torch.uint8)
        a = src.numpy()

        def strided_in(a: np.ndarray = a, ref: np.ndarray = ref, s: int = s) -> None:
            ref.reshape(s, -1)[...] = a.reshape(-1, s).T

        def strided_out(ref: np.ndarray = ref, back: torch.Tensor = back, s: int = s) -> None:
            back.numpy().reshape(-1, s)[...] = ref.reshape(s, -1).T

        t_in = best_ms(strided_in)
        p_in = best_ms(lambda s=s, planes=planes: shuffle_bytes(src, planes, s))
        if not np.array_equal(planes.numpy(), ref):
            raise AssertionError(f"{s}-byte shuffle differs from the strided copy")
        t_out = best_ms(strided_out)
        p_out = best_ms(lambda s=s, planes=planes, back=back: unshuffle_bytes(planes, back, s))
        if not torch.equal(back, src):
            raise AssertionError(f"{s}-byte unshuffle did not restore the bytes")
        print(
            f"| {s} B | {t_in:.1f} | {p_in:.1f} | {t_in / p_in:.2f}x "
            f"| {t_out:.1f} | {p_out:.1f} | {t_out / p_out:.2f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
