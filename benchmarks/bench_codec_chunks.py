"""One codec thread on 1 MiB chunks: the rates the adaptive mode weighs against a link.

For each synthetic data kind (32 MiB) and codec setting (lz4, zstd level 1 and 3, sparse,
and lz4 / zstd-1 after a byte shuffle by the element size, ``+shuffle``, as chunked
frames shuffle 2-, 4- and 8-byte elements), the tensor is compressed chunk by chunk into
a reused buffer and decoded into a reused target, as chunked frames do (a shuffled chunk
is shuffled into, and decoded through, a reused scratch buffer); best of 3 passes, wall
clock, one thread. Prints the ratio and the compress / decode rates in MB/s of raw data.

    python benchmarks/bench_codec_chunks.py [--chunk-mib 1] [--kinds a,b] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from p2p_compress import (
    SYNTHETIC_KINDS,
    Lz4Codec,
    SparseCodec,
    TensorCodec,
    ZstdCodec,
    make_synthetic_tensor,
    shuffle_bytes,
    unshuffle_bytes,
)

MiB = 1 << 20


def rates(
    codec: TensorCodec, data: torch.Tensor, chunk: int, itemsize: int = 0
) -> tuple[float, float, float]:
    """(ratio, compress MB/s, decode MB/s) of ``data`` (flat uint8) in ``chunk``-byte pieces.

    ``itemsize``: byte-shuffle each chunk by this element size first (0: do not).
    """
    bound = codec.max_compressed_size(chunk)
    assert bound is not None
    buf = torch.empty(bound, dtype=torch.uint8)
    out = torch.empty(chunk, dtype=torch.uint8)
    scratch = torch.empty(chunk, dtype=torch.uint8)
    best_c = best_d = float("inf")
    wire = 0
    for _ in range(3):
        tc = td = 0.0
        wire = 0
        for off in range(0, data.numel(), chunk):
            src = data[off : off + chunk]
            k = int(src.numel())
            t0 = time.perf_counter()
            if itemsize:
                shuffle_bytes(src, scratch[:k], itemsize)
                n = codec.compress_into(scratch[:k], buf)
            else:
                n = codec.compress_into(src, buf)
            t1 = time.perf_counter()
            if itemsize:
                codec.decompress_into(buf[:n], scratch[:k])
                unshuffle_bytes(scratch[:k], out[:k], itemsize)
            else:
                codec.decompress_into(buf[:n], out[:k])
            tc, td = tc + t1 - t0, td + time.perf_counter() - t1
            wire += n
        best_c, best_d = min(best_c, tc), min(best_d, td)
    nbytes = data.numel()
    return nbytes / wire, nbytes / best_c / 1e6, nbytes / best_d / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-mib", type=float, default=1.0, help="chunk size in MiB")
    parser.add_argument("--kinds", default="int64_token_ids,sparse_float32,random_float32")
    parser.add_argument("--out", type=Path, help="directory for codec_chunks.md")
    ns = parser.parse_args()
    chunk = int(ns.chunk_mib * MiB)
    kinds = [k for k in ns.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in SYNTHETIC_KINDS]
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; allowed: {', '.join(SYNTHETIC_KINDS)}")
    torch.set_num_threads(1)
    codecs: dict[str, TensorCodec] = {
        "lz4": Lz4Codec(),
        "zstd-1": ZstdCodec(1),
        "zstd-3": ZstdCodec(3),
        "sparse": SparseCodec(),
    }
    lines = [
        f"One codec thread, {ns.chunk_mib:g} MiB chunks of 32 MiB, best of 3 passes",
        "",
        "| kind | codec | ratio | compress MB/s | decode MB/s |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for kind in kinds:
        tensor = make_synthetic_tensor(kind, 32 * MiB, seed=1)
        data = tensor.view(-1).view(torch.uint8)
        runs = [(name, codec, 0) for name, codec in codecs.items()]
        if tensor.element_size() > 1:
            size = tensor.element_size()
            runs += [(f"{n}+shuffle", codecs[n], size) for n in ("lz4", "zstd-1")]
        for name, codec, itemsize in runs:
            ratio, comp, dec = rates(codec, data, chunk, itemsize)
            lines.append(f"| {kind} | {name} | {ratio:.2f} | {comp:.0f} | {dec:.0f} |")
            print(lines[-1], flush=True)
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "codec_chunks.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
