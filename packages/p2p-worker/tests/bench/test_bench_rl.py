"""The pure parts of ``p2p-bench rl``: spec, sampling, batches, loss, accounting, report.

The loop itself, with real workers on both stacks, is tested in
``tests/integration/test_rl_loop.py``.
"""

from __future__ import annotations

import doctest
import functools
import importlib

import pytest
import torch

from p2p_worker import LocalChannel, PlacementError
from p2p_worker.bench._rl import spec_from
from p2p_worker.bench._rl_ledger import Inbox, take_batch, trainer_key
from p2p_worker.bench._rl_ledger import account as account_ids
from p2p_worker.bench._rl_phases import PHASES, Span, SpanLog, account
from p2p_worker.bench._rl_placement import InOrder, Layout, layout
from p2p_worker.bench._rl_policy import (
    Learner,
    RLSpec,
    load_state,
    new_policy,
    order_batch,
    policy_state,
    reward,
    rollout_key,
    sample,
)
from p2p_worker.bench._rl_report import render_markdown

SPEC = RLSpec(model="tiny", rollout_workers=2, steps=2, batch=4, prompt_len=2, gen_len=3)


@pytest.mark.parametrize(
    "name", ["_rl_policy", "_rl_phases", "_rl_ledger", "_rl_placement", "_rl_report"]
)
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


@functools.cache
def _policy() -> torch.nn.Module:
    return new_policy(SPEC)  # every spec below has SPEC's model and seed


def _item(spec: RLSpec, step: int, rank: int) -> dict[str, torch.Tensor]:
    return sample(_policy(), spec, step, rank)


def test_a_trainer_takes_each_rollout_once_and_drops_what_arrives_twice() -> None:
    spec = RLSpec(**{**SPEC.as_dict(), "rollout_workers": 4, "batch": 2, "timeout": 0.5})
    channel = LocalChannel()
    key = trainer_key(1)  # trainer 1 trains on rollout workers 1 and 3
    for step, rank in [(1, 3), (2, 1), (2, 3), (2, 3), (1, 3), (3, 3)]:
        channel.put(_item(spec, step, rank), weight=spec.batch, key=key)
    inbox = Inbox(spec, 1)
    items, dropped = take_batch(channel, inbox, step=2)
    assert [rollout_key(spec, int(it["ids"][0])) for it in items] == [(2, 1), (2, 3)]
    assert dropped == 2  # the first item: step 1's, trained on already
    left = [rollout_key(spec, int(it["ids"][0])) for it in channel.peek_all(key)]
    assert left == [(2, 3), (1, 3), (3, 3)]
    with pytest.raises(RuntimeError, match=r"rollout worker\(s\) \[1\] for step 3 did not arrive"):
        take_batch(channel, inbox, step=3)
    assert channel.qsize(key) == 0  # both copies of a trained item dropped on the way


def test_an_item_of_a_later_step_waits_for_its_step() -> None:
    spec = RLSpec(**{**SPEC.as_dict(), "timeout": 0.5})  # trainer 0 trains on rank 0 alone
    channel = LocalChannel()
    for step in (2, 1, 2):
        channel.put(_item(spec, step, 0), weight=spec.batch, key=trainer_key(0))
    inbox = Inbox(spec, 0)
    assert [rollout_key(spec, int(it["ids"][0])) for it in take_batch(channel, inbox, 1)[0]] == [
        (1, 0)
    ]
    assert list(inbox.early) == [(2, 0)]
    items, dropped = take_batch(channel, inbox, 2)  # from the inbox, no wait
    assert ([rollout_key(spec, int(it["ids"][0])) for it in items], dropped) == ([(2, 0)], 0)
    assert channel.qsize(trainer_key(0)) == 1  # the second copy: dropped by the next take


def test_with_overlap_the_rollout_workers_sample_the_next_step() -> None:
    spec, _, _ = spec_from(["--quick", "--steps", "4", "--overlap"])
    assert [spec.sampled_in(s) for s in (1, 2, 3, 4)] == [[1, 2], [3], [4], []]
    assert RLSpec(**{**SPEC.as_dict(), "steps": 2}).sampled_in(2) == [2]
    with pytest.raises(ValueError, match=r"^kill_rollout: got 2; allowed: no kill with --overlap"):
        RLSpec(**{**SPEC.as_dict(), "overlap": True, "kill_rollout": 2})


def test_with_overlap_the_weights_phase_is_the_slowest_pull_of_the_previous_version() -> None:
    spans = [
        Span("rollout 0", "pull", 0.0, 0.2),  # the version pushed in the step before
        Span("rollout 1", "pull", 0.0, 0.3),
        Span("rollout 0", "generate", 0.3, 1.0),
        Span("trainer 0", "push", 0.9, 0.95),  # this step's version, pulled in the next
    ]
    assert account(spans, wall=1.0)["weights"] == pytest.approx(0.3)


def test_the_accounting_counts_lost_twice_and_unknown_ids() -> None:
    spec = RLSpec(**{**SPEC.as_dict(), "steps": 2, "batch": 2})  # 2 x 2 x 2 = 8 ids due
    whole = account_ids(spec, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert (whole["due"], whole["trained"], whole["exactly_once"]) == (8, 8, True)
    broken = account_ids(spec, [[0, 1, 2, 3], [3, 3, 4, 5, 9]])
    assert {k: broken[k] for k in ("trained", "lost", "twice", "unknown")} == {
        "trained": 9,
        "lost": 2,
        "twice": 1,
        "unknown": 1,
    }
    assert broken["exactly_once"] is False


def test_kill_rollout_is_a_step_of_the_run() -> None:
    spec, _, _ = spec_from(["--quick", "--steps", "3", "--kill-rollout", "3"])
    assert (spec.kill_rollout, spec.victim) == (3, 1)
    with pytest.raises(ValueError, match=r"^kill_rollout: got 4; allowed: a step in 1..3"):
        RLSpec(**{**SPEC.as_dict(), "steps": 3, "kill_rollout": 4})


def test_a_kill_step_beyond_the_run_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        spec_from(["--quick", "--steps", "3", "--kill-rollout", "0"])
    assert exc.value.code == 2
    assert "--kill-rollout: got 0; allowed: a step in 1..3" in capsys.readouterr().err


def test_the_report_leaves_the_lost_step_out_of_the_means_and_gives_the_accounting() -> None:
    records = []
    for stack in ("p2p", "ray"):
        for step in (1, 2, 3, 4):
            slow = 10.0 if (stack, step) == ("p2p", 3) else 1.0
            phases = dict.fromkeys(PHASES, 0.1 * slow)
            rec = {"stack": stack, "step": step, "reward": 0.1, **phases, "loss": 0.0}
            rec.update(moving=0.3 * slow, step_s=0.6 * slow)
            if (stack, step) == ("p2p", 3):
                rec["lost_worker"] = True
            records.append(rec)
    tally = {"due": 8, "trained": 8, "lost": 0, "twice": 0, "unknown": 0}
    tally.update(exactly_once=True, resampled=2, dropped=0)
    event = {"event": "killed", "step": 3, "slot": 1, "worker": "r:1", "pid": 7, "how": "SIGKILL"}
    text = render_markdown(records, {"accounting": {"p2p": tally}, "events": [event]})
    assert "| weights | 0.1000 | 0.1000 | 1.00x |" in text  # step 3 left out on both stacks
    assert "mean over steps 2-4 except 3" in text
    assert "- p2p: rollout 1 (r:1, pid 7) killed with SIGKILL during step 3" in text
    assert (
        "- p2p rollout accounting: 8 rollout ids due, 8 trained, 0 lost, 0 trained twice,"
        " 0 unknown; 2 sampled again by a replacement, 0 dropped as arriving twice"
    ) in text
    assert "| 3 (rollout worker lost on p2p) | 0.1000 | 0.1000 |" in text


def test_placement_and_stack_flags() -> None:
    spec, _, _ = spec_from(["--quick", "--placement", "spread", "--stack", "p2p"])
    assert (spec.placement, spec.stack, spec.stacks) == ("spread", "p2p", ("p2p",))
    spec, _, _ = spec_from(["--quick", "--link-mbps", "1000"])
    assert (spec.placement, spec.stacks, spec.link_mbps) == ("one-node", ("p2p", "ray"), 1000.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--placement", "two-nodes"], "--placement: invalid choice: 'two-nodes'"),
        (["--stack", "gloo"], "--stack: invalid choice: 'gloo'"),
        (["--link-mbps", "0"], "--link-mbps: got 0.0; allowed: Mbit/s > 0"),
        (["--stack", "ray", "--kill-rollout", "2"], "--kill-rollout: got 2; allowed: no kill"),
    ],
)
def test_a_bad_placement_stack_or_link_rate_exits_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        spec_from(["--quick", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_spread_keeps_the_trainers_on_node_0_and_deals_the_rollouts_round_robin() -> None:
    assert layout("spread", 2, 3, 4) == Layout(trainers=(0, 0), rollouts=(1, 2, 3))
    assert layout("spread", 2, 5, 3).rollouts == (1, 2, 1, 2, 1)
    assert layout("spread", 1, 2, 2).rollouts == (1, 1)
    assert layout("one-node", 2, 3, 4) == Layout(trainers=(0, 0), rollouts=(0, 0, 0))
    assert layout("one-node", 2, 2, 1).rollouts == (0, 0)
    with pytest.raises(ValueError, match=r"^placement: got 'ring'; allowed: one-node, spread"):
        layout("ring", 2, 2, 4)


def test_spread_on_one_node_is_a_placement_error_naming_the_problem() -> None:
    with pytest.raises(PlacementError, match=r"--placement spread: the Ray cluster has 1 node;"):
        layout("spread", 2, 2, 1)
    with pytest.raises(ValueError, match=r"^placement: got 'spread-out'"):
        RLSpec(**{**SPEC.as_dict(), "placement": "spread-out"})


def test_rollout_workers_keep_their_order_on_the_nodes() -> None:
    # NodePlacementStrategy sorts; InOrder puts worker i on nodes[i]
    plan = InOrder([1, 2, 1]).plan([object()] * 3)
    assert [(p.rank, p.node_rank, p.num_cpus) for p in plan] == [
        (0, 1, 0.0),
        (1, 2, 0.0),
        (2, 1, 0.0),
    ]
    with pytest.raises(PlacementError, match=r"node rank\(s\) \[3\], but the cluster has 2"):
        InOrder([3]).plan([object()] * 2)


def test_the_report_holds_each_weight_sync_against_the_link_and_runs_one_stack() -> None:
    records = []
    for step in (1, 2, 3):
        phases = dict.fromkeys(PHASES, 0.1)
        rec = {"stack": "p2p", "step": step, "reward": 0.1 * step, **phases, "loss": 0.0}
        rec.update(moving=0.3, step_s=0.6, weights_sent_bytes=12_500_000)
        records.append(rec)
    records[2]["weights"] = 0.2
    meta = {"link Mbit/s": 1000.0, "nodes": {"p2p": {"trainer 0": "10.0.0.1"}}}
    text = render_markdown(records, meta)
    assert "| phase | p2p |\n|---|---|\n| generate | 0.1000 |" in text
    assert "- p2p workers: trainer 0 on 10.0.0.1" in text
    # 12.5 MB over 1 Gbit/s: 0.1 s; the bound 0.15 s
    assert "| 2 | p2p | 12,500,000 | 0.1000 | 0.1500 | 0.1000 | 1.00x | yes |" in text
    assert "| 3 | p2p | 12,500,000 | 0.1000 | 0.1500 | 0.2000 | 2.00x | no |" in text
    assert "| 3 | 0.3000 |" in text
    assert "Weight sync" not in render_markdown(records, {})
