"""The pure parts of ``p2p-bench rl``: spec, sampling, batches, loss, accounting, report.

The loop itself, with real workers on both stacks, is tested in
``tests/integration/test_rl_loop.py``.
"""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

from p2p_worker.bench._rl import spec_from
from p2p_worker.bench._rl_phases import PHASES, Span, SpanLog, account
from p2p_worker.bench._rl_policy import (
    Learner,
    RLSpec,
    load_state,
    new_policy,
    order_batch,
    policy_state,
    reward,
    sample,
)
from p2p_worker.bench._rl_report import render_markdown

SPEC = RLSpec(model="tiny", rollout_workers=2, steps=2, batch=4, prompt_len=2, gen_len=3)


@pytest.mark.parametrize("name", ["_rl_policy", "_rl_phases"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(f"p2p_worker.bench.{name}"))
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model": "huge"}, "model"),
        ({"rollout_workers": 0}, "rollout_workers"),
        ({"trainers": 3}, "rollout_workers"),
        ({"lr": 0.0}, "lr"),
        ({"batch": True}, "batch"),
        ({"timeout": -1.0}, "timeout"),
    ],
)
def test_a_bad_spec_names_the_field(change: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named}: got"):
        RLSpec(**{**SPEC.as_dict(), **change})  # type: ignore[arg-type]


def test_a_bad_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        spec_from(["--rollout-workers", "0"])
    assert exc.value.code == 2
    assert "--rollout-workers: got 0" in capsys.readouterr().err


def test_too_few_rollout_workers_for_the_trainers_names_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        spec_from(["--rollout-workers", "1"])
    assert "--rollout-workers: got 1; allowed: at least the number of trainers (2)" in (
        capsys.readouterr().err
    )


def test_quick_flags_on_top() -> None:
    spec, out, address = spec_from(["--quick", "--steps", "3", "--out", "x"])
    assert (spec.model, spec.steps, str(out), address) == ("tiny", 3, "x", None)


def test_sampling_is_a_function_of_seed_step_rank_and_weights() -> None:
    policy = new_policy(SPEC)
    a = sample(policy, SPEC, step=1, rank=0)
    b = sample(new_policy(SPEC), SPEC, step=1, rank=0)
    c = sample(policy, SPEC, step=1, rank=1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tokens"], c["tokens"])
    assert a["tokens"].shape == (4, 5)
    assert torch.equal(a["rewards"], reward(a["tokens"][:, 2:], SPEC.shape.vocab))


def test_batches_are_ordered_by_rollout_id_whatever_the_arrival() -> None:
    policy = new_policy(SPEC)
    items = [sample(policy, SPEC, 1, rank) for rank in (0, 1)]
    one = order_batch(items, SPEC)
    two = order_batch(items[::-1], SPEC)
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert one["ids"].tolist() == list(range(8))
    with pytest.raises(ValueError, match="arrived twice"):
        order_batch([items[0], items[0]], SPEC)
    with pytest.raises(ValueError, match="missing"):
        order_batch([{"ids": torch.zeros(1)}], SPEC)


def test_summed_halves_are_the_whole_batch_gradient() -> None:
    policy = new_policy(SPEC)
    items = [sample(policy, SPEC, 1, rank) for rank in (0, 1)]
    whole = Learner(SPEC).backward(order_batch(items, SPEC))
    halves = [Learner(SPEC).backward(order_batch([it], SPEC)) for it in items]
    assert torch.allclose(halves[0] + halves[1], whole, atol=1e-7)
    learner = Learner(SPEC)
    before = {k: v.clone() for k, v in policy_state(learner.model).items()}
    learner.apply(whole)
    assert any(not torch.equal(before[k], v) for k, v in policy_state(learner.model).items())
    with pytest.raises(ValueError, match="flat: got 3 values"):
        learner.apply(torch.zeros(3))
    copy = new_policy(SPEC)
    load_state(copy, policy_state(learner.model))
    pairs = zip(copy.parameters(), learner.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_accounting_follows_the_critical_path() -> None:
    spans = [
        Span("rollout 0", "generate", 0.0, 1.0),
        Span("rollout 1", "generate", 0.0, 1.2),
        Span("trainer 0", "get", 0.0, 1.3),
        Span("trainer 1", "get", 0.0, 1.5),
        Span("trainer 0", "train", 1.3, 1.6),
        Span("trainer 1", "train", 1.5, 1.7),
        Span("trainer 0", "allreduce", 1.6, 1.9),
        Span("trainer 1", "allreduce", 1.7, 1.9),
        Span("trainer 0", "optim", 1.9, 2.0),
        Span("trainer 0", "push", 2.0, 2.5),
        Span("rollout 1", "pull", 1.2, 2.6),
    ]
    got = account(spans, wall=3.0)
    want = {"generate": 1.2, "rollouts": 0.3, "train": 0.4, "allreduce": 0.2, "weights": 0.6}
    for phase, seconds in want.items():
        assert got[phase] == pytest.approx(seconds)
    assert got["idle"] == pytest.approx(3.0 - sum(want.values()))
    assert account(spans, wall=1.0)["idle"] == 0.0
    with pytest.raises(ValueError, match="activity: got 'sleep'"), SpanLog("x").span("sleep"):
        pass


def test_the_report_gives_means_and_the_ratio() -> None:
    records = []
    for stack, scale in (("p2p", 1.0), ("ray", 3.0)):
        for step in (1, 2, 3):
            phases = dict.fromkeys(PHASES, 0.1 * scale)
            rec = {"stack": stack, "step": step, "reward": 0.1 * step, **phases}
            records.append({**rec, "moving": 0.3 * scale, "step_s": 0.6 * scale, "loss": 0.0})
    text = render_markdown(records, {"model": "tiny", "checks": {"it held": True}})
    assert "| weights | 0.1000 | 0.3000 | 3.00x |" in text
    assert "mean over steps 2-3" in text
    assert "- it held: yes" in text
    assert "| 3 | 0.3000 | 0.3000 |" in text
