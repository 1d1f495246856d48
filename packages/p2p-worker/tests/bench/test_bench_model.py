"""The benchmark's model: real shapes, real AdamW steps, deterministic by seed."""

from __future__ import annotations

import pytest
import torch

from p2p_worker.bench._model import SHAPES, Decoder, DecoderShape, WeightSteps, changed_fraction


def test_shapes_count_their_parameters_as_the_model_has_them() -> None:
    for name in ("tiny", "small"):
        model = Decoder(SHAPES[name])
        assert sum(p.numel() for p in model.parameters()) == SHAPES[name].parameter_count()
    # Qwen2.5-0.5B's published size: 0.49 B parameters with the head tied to the embedding
    assert SHAPES["qwen2.5-0.5b"].parameter_count() == 494_032_768


def test_same_seed_same_weights_and_steps_move_a_few_percent_at_lr_1e_6() -> None:
    a = WeightSteps(SHAPES["tiny"], lr=1e-6, seed=3)
    b = WeightSteps(SHAPES["tiny"], lr=1e-6, seed=3)
    first = a.weights()
    assert all(torch.equal(first[k], v) for k, v in b.weights().items())
    assert first["embed.weight"].dtype == torch.bfloat16
    assert "head.weight" not in first  # tied to the embedding: handed out once
    fractions = []
    prev = first
    for _ in range(6):
        cur = a.step()
        fractions.append(changed_fraction(prev, cur))
        prev = cur
    assert all(0.0 < f < 0.2 for f in fractions), fractions
    assert all(torch.equal(prev[k], v) for k, v in a.weights().items())
    assert a.steps == 6
    assert a.last_loss == a.last_loss  # a number, not NaN
    assert changed_fraction(prev, prev) == 0.0


def test_refresh_in_place_equals_a_step_and_counts_the_same_changes() -> None:
    a = WeightSteps(SHAPES["tiny"], lr=1e-5, seed=4)
    b = WeightSteps(SHAPES["tiny"], lr=1e-5, seed=4)
    held = a.weights()
    storage = {k: v.data_ptr() for k, v in held.items()}
    for _ in range(3):
        before = {k: v.clone() for k, v in held.items()}
        a.train()
        fraction = a.refresh(held)
        expected = b.step()
        assert all(torch.equal(held[k], v) for k, v in expected.items())
        assert fraction == changed_fraction(before, expected) > 0.0
    assert {k: v.data_ptr() for k, v in held.items()} == storage  # written in place
    assert a.refresh(held) == 0.0  # nothing trained since: nothing changed


def test_bad_shapes_and_rates_name_the_argument() -> None:
    with pytest.raises(ValueError, match="hidden: got 0"):
        DecoderShape("x", 10, 0, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="heads/kv_heads"):
        DecoderShape("x", 10, 64, 1, 4, 3, 1)
    with pytest.raises(ValueError, match="lr: got 0"):
        WeightSteps(SHAPES["tiny"], lr=0)
