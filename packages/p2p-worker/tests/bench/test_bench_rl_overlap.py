"""The RL loop with ``--overlap`` on p2p: one step off-policy, checked against a reference.

The session's embedded Ray cluster on 127.0.0.1 and the p2p loop alone (two trainers, two
rollout workers, a channel, the trainers' allreduce, an asynchronous weight push): while
the trainers train step k, the rollout workers pull version k-1 and sample step k+1.
The test computes the same schedule in this process with the same functions (rollouts
of step s sampled with the weights of step s-2, gradients of the two trainers summed)
and checks that the loop's rewards and final weights equal it bit for bit, that every
rollout id was trained on exactly once, and that each step's spans follow the schedule.
(The Ray baseline's overlap runs in ``p2p-bench rl --overlap``; a second stack here would
cost CI another start of four workers.)
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from p2p_worker.bench._rl import record
from p2p_worker.bench._rl_actors import P2PLoop
from p2p_worker.bench._rl_ledger import account
from p2p_worker.bench._rl_policy import (
    Learner,
    RLSpec,
    load_state,
    new_policy,
    order_batch,
    pin_threads,
    policy_state,
    sample,
)
from p2p_worker.bench._weights_actors import state_checksum

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 3
SPEC = RLSpec(model="tiny", rollout_workers=2, steps=STEPS, batch=4, timeout=120.0, overlap=True)


@pytest.fixture(scope="module")
def run(ray_session: object) -> dict[str, Any]:
    loop = P2PLoop(SPEC)  # a job of its own on the session's Ray cluster
    try:
        records, timelines, ids = [], [], []
        for step in range(1, STEPS + 1):
            start = time.time()
            result = loop.step(step)
            ids += [t["ids"] for t in result[1]]
            rec, tl = record("p2p", step, start, result)
            records.append(rec)
            timelines.append(tl)
        sums = loop.checksums()
    finally:
        loop.close()
    return {"records": records, "timelines": timelines, "ids": ids, "sums": sums}


def _reference(spec: RLSpec) -> tuple[list[float], int]:
    """Rewards per step and the final weights' checksum of the overlap schedule, here.

    On one torch thread, as the workers (the sums of a matmul may depend on the split).
    """
    threads = torch.get_num_threads()
    pin_threads()
    try:
        return _schedule(spec)
    finally:
        torch.set_num_threads(threads)


def _schedule(spec: RLSpec) -> tuple[list[float], int]:
    learner = Learner(spec)
    versions = {0: {k: v.clone() for k, v in policy_state(learner.model).items()}}
    rewards = []
    for step in range(1, spec.steps + 1):
        policy = new_policy(spec)
        load_state(policy, versions[max(step - 2, 0)])  # one step off-policy
        items = [sample(policy, spec, step, rank) for rank in range(spec.rollout_workers)]
        grads = [
            learner.backward(order_batch([items[r] for r in spec.sources_of(t)], spec)).clone()
            for t in range(spec.trainers)
        ]
        learner.apply(grads[0] + grads[1])  # what the trainers' allreduce sums
        versions[step] = {k: v.clone() for k, v in policy_state(learner.model).items()}
        values = [x for it in items for x in it["rewards"].tolist()]
        rewards.append(sum(values) / len(values))
    return rewards, state_checksum(policy_state(learner.model))


def test_the_loop_equals_the_one_step_off_policy_schedule_bit_for_bit(
    run: dict[str, Any],
) -> None:
    rewards, checksum = _reference(SPEC)
    assert [r["reward"] for r in run["records"]] == rewards  # floats equal, not approximately
    assert len(set(rewards)) > 1
    assert set(run["sums"].values()) == {checksum}  # every worker holds the trainers' weights


def test_every_rollout_id_is_trained_on_exactly_once(run: dict[str, Any]) -> None:
    tally = account(SPEC, run["ids"])
    assert (tally["due"], tally["trained"], tally["exactly_once"]) == (24, 24, True)
    assert [r["dropped"] for r in run["records"]] == [0] * STEPS


def test_the_rollout_workers_sample_the_next_step_while_the_trainers_train(
    run: dict[str, Any],
) -> None:
    # per step and rollout worker: what it did, in order
    want = {
        1: ["generate", "put", "generate", "put"],  # steps 1 and 2 on the initial weights
        2: ["pull", "generate", "put"],  # version 1, then step 3's rollouts
        3: ["pull", "pull"],  # version 2, and the last version: nothing left to sample
    }
    for tl in run["timelines"]:
        for rank in (0, 1):
            done = [s[1] for s in tl["spans"] if s[0] == f"rollout {rank}"]
            assert done == want[tl["step"]], (tl["step"], rank, done)
        trainer = [s[1] for s in tl["spans"] if s[0] == "trainer 0"]
        assert trainer[:3] == ["get", "train", "allreduce"]
        # the push of each version but the last runs on while the rollout workers pull it
        # in the next step; trainer 0 waits for it there before its optimizer step
        if tl["step"] > 1:
            assert trainer[3:5] == ["push", "optim"]
