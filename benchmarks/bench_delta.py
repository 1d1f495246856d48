"""Benchmark p2p-compress weight deltas on the AdamW steps of a real small model.

A decoder-only transformer of about 21M parameters (plain torch: embedding, 4 pre-norm
layers of width 512, untied head) trains on synthetic copy-task tokens with AdamW
(fp32 master weights, weight decay 0.01). After every step the bf16 copy a rollout
worker would receive is taken; the steps after the first ``--warm`` (5) are measured,
for each learning rate (default 1e-6 and 1e-5), one patch per parameter tensor (the
call pattern of a weight sync):

* wire: ``encode_delta(new, base)`` (zstd level 1, prefer smallest), its kinds, and
  the same with ``prefer="fast"``, ``codec="lz4"`` and ``codec="raw"``;
* baselines in the same run: zstd level 1 of the dense XOR ``new ^ base`` as it is,
  and zstd level 1 of the full bf16 bytes;
* ratio = full bf16 bytes / wire bytes (the goal at lr 1e-6: >= 40);
* speed, one thread (``torch.set_num_threads(1)``), the calling thread's CPU time
  (``--clock cpu``, so other load on a shared machine does not count), best of
  ``--rounds``: encode, and decode into a target holding the base, in GB/s of full bf16
  bytes (the goal on ~2% changed: >= 1 GB/s each); the dense-XOR baseline alike;
* memory: what one encode of the largest tensor allocates besides its payload: scratch
  buffers (leased from a fresh pool, so its cached bytes afterwards are their total) and
  numpy temporaries (tracemalloc's peak), as multiples of the tensor's bytes.

Then ``tensor_checksum`` against ``zlib.crc32`` and ``zlib.adler32`` on the model's
bytes. Prints the table; ``--out DIR`` also writes ``delta.md`` and ``delta.json``.

    python benchmarks/bench_delta.py
    python benchmarks/bench_delta.py --quick
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import tracemalloc
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from p2p_compress import (
    TensorBufferPool,
    ZstdCodec,
    apply_delta,
    encode_delta,
    tensor_checksum,
)

VOCAB, WIDTH, LAYERS, HEADS, FFN, SEQ, BATCH = 8192, 512, 4, 8, 2048, 128, 8
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
State = dict[str, torch.Tensor]


class Decoder(nn.Module):
    """A small pre-norm decoder-only transformer (causal self-attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                WIDTH, HEADS, FFN, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(LAYERS)
        )
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.embed(x) + self.pos[: x.shape[1]]
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


def train(lr: float, steps: int, seed: int) -> list[State]:
    """The bf16 copy of the weights after each AdamW step."""
    torch.manual_seed(seed)
    model = Decoder()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        x[:, SEQ // 2 + 1 :] = x[:, 1 : SEQ // 2 + 1]  # copy task: the second half repeats
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append({n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()})
    return out


def best(func: Callable[[], object], rounds: int, clock: Callable[[], float]) -> float:
    func()  # warm up
    times = []
    for _ in range(rounds):
        start = clock()
        func()
        times.append(clock() - start)
    return min(times)


def xor_zstd(new: State, base: State, codec: ZstdCodec) -> tuple[int, Callable[[], int]]:
    """Wire bytes of zstd-1 over each dense XOR, and a function doing that work."""

    def run() -> int:
        total = 0
        for name, t in new.items():
            x = torch.bitwise_xor(t.view(torch.int16), base[name].view(torch.int16))
            buf = torch.empty(codec.max_compressed_size(x.nbytes) or 0, dtype=torch.uint8)
            total += codec.compress_into(x, buf)
        return total

    return run(), run


def full_zstd(new: State, codec: ZstdCodec) -> int:
    total = 0
    for t in new.values():
        buf = torch.empty(codec.max_compressed_size(t.nbytes) or 0, dtype=torch.uint8)
        total += codec.compress_into(t, buf)
    return total


def measure_step(
    base: State, new: State, rounds: int, clock: Callable[[], float]
) -> dict[str, Any]:
    full = sum(t.nbytes for t in new.values())
    numel = sum(t.numel() for t in new.values())
    patches = {n: encode_delta(t, base[n]) for n, t in new.items()}
    wire = sum(p.wire_nbytes for p in patches.values())
    changed = sum(p.changed for p in patches.values())
    row: dict[str, Any] = {
        "changed": changed / numel,
        "full_bytes": full,
        "wire": wire,
        "kinds": dict(Counter(p.kind for p in patches.values())),
    }
    for key, kwargs in (
        ("wire_fast", {"prefer": "fast"}),
        ("wire_lz4", {"codec": "lz4"}),
        ("wire_raw", {"codec": "raw"}),
    ):
        row[key] = sum(encode_delta(t, base[n], **kwargs).wire_nbytes for n, t in new.items())
    zstd = ZstdCodec(level=1)
    row["xor_zstd"], xor_run = xor_zstd(new, base, zstd)
    row["full_zstd"] = full_zstd(new, zstd)
    targets = {n: t.clone() for n, t in base.items()}

    def encode_all() -> None:
        for n, t in new.items():
            encode_delta(t, base[n])

    def reset() -> None:
        for n, t in targets.items():
            t.copy_(base[n])

    def decode_all() -> None:
        for n, p in patches.items():
            apply_delta(p, targets[n])

    torch.set_num_threads(1)
    row["enc_s"] = best(encode_all, rounds, clock)
    row["xor_enc_s"] = best(xor_run, rounds, clock)
    row["reset_s"] = best(reset, rounds, clock)
    row["dec_s"] = best(lambda: (reset(), decode_all()), rounds, clock) - row["reset_s"]
    reset()
    decode_all()
    assert all(
        torch.equal(targets[n].view(torch.int16), t.view(torch.int16)) for n, t in new.items()
    )
    return row


def memory(base: State, new: State) -> dict[str, Any]:
    """Scratch and numpy temporaries of one encode and one decode of the largest tensor."""
    name = max(new, key=lambda n: new[n].numel())
    t, b = new[name], base[name]
    pool = TensorBufferPool(max_bytes=1 << 34)
    tracemalloc.start()
    patch = encode_delta(t, b, pool=pool)
    _, enc_peak = tracemalloc.get_traced_memory()
    enc_scratch = pool.stats()["cached_bytes"]
    pool.clear()
    tracemalloc.reset_peak()
    target = b.clone()
    start, _ = tracemalloc.get_traced_memory()
    apply_delta(patch, target, pool=pool)
    _, dec_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "tensor": name,
        "nbytes": t.nbytes,
        "changed": patch.changed / t.numel(),
        "encode_scratch": enc_scratch / t.nbytes,
        "encode_numpy_peak": enc_peak / t.nbytes,
        "decode_scratch": pool.stats()["cached_bytes"] / t.nbytes,
        "decode_numpy_peak": (dec_peak - start) / t.nbytes,
        "payload": patch.wire_nbytes / t.nbytes,
    }


def checksums(state: State, rounds: int, clock: Callable[[], float]) -> dict[str, float]:
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    data = flat.view(torch.uint8).numpy()
    torch.set_num_threads(1)
    out = {}
    for name, func in (
        ("tensor_checksum", lambda: tensor_checksum(flat)),
        ("zlib.crc32", lambda: zlib.crc32(data)),
        ("zlib.adler32", lambda: zlib.adler32(data)),
    ):
        out[name] = flat.nbytes / best(func, rounds, clock) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    parser.add_argument("--warm", type=int, default=5, help="steps not measured")
    parser.add_argument("--measure", type=int, default=3, help="steps measured per lr")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1 measured step, 3 rounds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.measure, args.rounds = 1, 3
    clock = CLOCKS[args.clock]
    threads = torch.get_num_threads()
    results: dict[str, Any] = {"platform": platform.platform(), "torch": torch.__version__}
    lines = [
        "| lr | step | changed | kinds | ratio | fast | lz4 | raw | zstd(xor) | zstd(full) "
        "| enc GB/s | dec GB/s | zstd(xor) enc GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lr in args.lrs:
        torch.set_num_threads(threads)
        states = train(lr, args.warm + args.measure, args.seed)
        params = sum(t.numel() for t in states[0].values())
        results["params"] = params
        rows = []
        for step in range(args.warm, args.warm + args.measure):
            row = measure_step(states[step - 1], states[step], args.rounds, clock)
            row["step"] = step
            rows.append(row)
            f = row["full_bytes"]
            kinds = " ".join(f"{k}:{v}" for k, v in sorted(row["kinds"].items()))
            lines.append(
                f"| {lr:g} | {step} | {row['changed']:.2%} | {kinds} | {f / row['wire']:.1f}x "
                f"| {f / row['wire_fast']:.1f}x | {f / row['wire_lz4']:.1f}x "
                f"| {f / row['wire_raw']:.1f}x | {f / row['xor_zstd']:.1f}x "
                f"| {f / row['full_zstd']:.2f}x | {f / row['enc_s'] / 1e9:.2f} "
                f"| {f / row['dec_s'] / 1e9:.2f} | {f / row['xor_enc_s'] / 1e9:.2f} |"
            )
            print(lines[-1], flush=True)
        results[f"lr={lr:g}"] = {"rows": rows, "memory": memory(states[-2], states[-1])}
        del states
    results["checksum_GBps"] = checksums(train(args.lrs[0], 1, args.seed)[0], args.rounds, clock)
    text = [
        f"p2p-compress weight deltas: a {results['params'] / 1e6:.1f}M-parameter decoder, "
        f"AdamW, bf16 copies, one patch per tensor; ratios are full bf16 bytes / wire bytes; "
        f"speeds on one thread ({args.clock} clock), GB/s of full bf16 bytes.",
        "",
        *lines,
        "",
        "memory of one encode/decode of the largest tensor (multiples of its bytes):",
    ]
    for lr in args.lrs:
        m = results[f"lr={lr:g}"]["memory"]
        text.append(
            f"  lr {lr:g}: {m['tensor']} ({m['nbytes'] / 2**20:.0f} MiB, {m['changed']:.2%} "
            f"changed): encode scratch {m['encode_scratch']:.2f} + numpy peak "
            f"{m['encode_numpy_peak']:.2f}, payload {m['payload']:.3f}; decode scratch "
            f"{m['decode_scratch']:.3f} + numpy peak {m['decode_numpy_peak']:.2f}"
        )
    speeds = results["checksum_GBps"]
    text.append(
        "checksum, GB/s on one thread: "
        + ", ".join(f"{k} {v:.2f}" for k, v in speeds.items())
        + f" (tensor_checksum / crc32 = {speeds['tensor_checksum'] / speeds['zlib.crc32']:.2f}x)"
    )
    print("\n".join(text[-(len(args.lrs) + 2) :]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "delta.md").write_text("\n".join(text) + "\n")
        (args.out / "delta.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
