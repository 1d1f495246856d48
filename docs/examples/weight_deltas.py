"""Sending only what changed: a bit-level weight delta with p2p-compress alone.

Runs on its own: ``python docs/examples/weight_deltas.py``. The trainer encodes the new
bf16 copy of a weight against what the rollout worker holds (``base``); the worker
applies the patch in place and checks the checksum, bit for bit.
"""

from __future__ import annotations

import torch

from p2p_compress import DeltaPatch, apply_delta, encode_delta, tensor_checksum

torch.manual_seed(0)
base = torch.randn(1 << 20).to(torch.bfloat16)  # what the worker holds (2 MiB)
new = base.clone()
moved = torch.randperm(base.numel())[: base.numel() // 50]  # 2% of the values change
new[moved] = (new[moved].float() * (1 + 1e-2)).to(torch.bfloat16)


def main() -> None:
    # trainer: the patch travels as a small dict and a uint8 tensor
    patch = encode_delta(new, base)
    meta, payload = patch.meta(), patch.payload
    digest = tensor_checksum(new)
    full = new.numel() * new.element_size()
    print(f"{patch.kind}: {full} -> {patch.wire_nbytes} bytes ({full / patch.wire_nbytes:.0f}x)")

    # rollout worker: `weights` holds `base` and is written in place
    weights = base.clone()
    apply_delta(DeltaPatch.from_meta(meta, payload), weights)
    assert tensor_checksum(weights) == digest
    assert torch.equal(weights.view(torch.int16), new.view(torch.int16))  # bit-exact
    assert patch.wire_nbytes * 10 < full
    print("weight_deltas: ok")


if __name__ == "__main__":
    main()
