from __future__ import annotations

import pytest
import torch

from p2p_compress import SYNTHETIC_KINDS, make_synthetic_tensor

EXPECTED = {
    "random_float32": torch.float32,
    "sparse_float32": torch.float32,
    "bf16_weights": torch.bfloat16,
    "int64_token_ids": torch.int64,
    "bool_mask": torch.bool,
    "repeated": torch.float32,
}


@pytest.mark.parametrize("kind", SYNTHETIC_KINDS)
def test_kinds(kind: str) -> None:
    t = make_synthetic_tensor(kind, 65536, seed=3)
    assert t.dtype == EXPECTED[kind]
    assert t.dim() == 1
    assert t.is_contiguous()
    assert t.numel() * t.element_size() == 65536
    assert torch.equal(t, make_synthetic_tensor(kind, 65536, seed=3))  # deterministic
    assert make_synthetic_tensor(kind, 0).numel() == 0


def test_properties_of_kinds() -> None:
    sparse = make_synthetic_tensor("sparse_float32", 400_000)
    assert 0.85 < float((sparse == 0).float().mean()) < 0.95
    ids = make_synthetic_tensor("int64_token_ids", 80_000)
    assert int(ids.min()) >= 0
    assert int(ids.max()) < 50257


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        make_synthetic_tensor("gaussian", 10)
    with pytest.raises(ValueError, match="nbytes"):
        make_synthetic_tensor("bool_mask", -1)
