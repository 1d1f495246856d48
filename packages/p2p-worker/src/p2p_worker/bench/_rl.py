"""``p2p-bench rl``: a small RL loop that learns, on p2p and on Ray's own primitives.

Both stacks run the same loop (:mod:`p2p_worker.bench._rl_policy`: the policy, its
sampling, the reward, the REINFORCE loss) with the same seeds, their steps interleaved
(a p2p step, then a Ray step) so that a change of load on the machine hits both alike.
On p2p (:mod:`p2p_worker.bench._rl_actors`) rollouts travel through a channel, gradients
through the trainer group's allreduce and weights with ``push_weights`` /
``pull_weights``; on Ray (:mod:`p2p_worker.bench._rl_ray`) through
``ray.util.queue.Queue``, ``ray.util.collective`` (gloo) and ``ray.put`` / ``ray.get``.
Batches are ordered by rollout id, so the transport changes nothing but time: both
stacks produce the same reward curve, bit for bit, and every rollout worker ends holding
the trainer's weights exactly. The run checks both and says so in the report, and
counts every rollout id the trainers trained on (:mod:`p2p_worker.bench._rl_ledger`):
each exactly once.

``--overlap`` runs both stacks one step off-policy (the rollout workers sample step k+1
while the trainers train step k). ``--kill-rollout STEP`` kills a rollout worker of the
p2p loop during that step and puts a replacement in its place
(:mod:`p2p_worker.bench._rl_recovery`); the Ray baseline runs without the kill, and the
curves stay equal because the replacement samples the lost sequences again.

``--placement spread`` keeps the trainers on node 0 and spreads the rollout workers over
the other nodes of a multi-node cluster (``--address``), both stacks alike
(:mod:`p2p_worker.bench._rl_placement`); the run records every worker's node address.
``--stack p2p`` (or ``ray``) runs one stack alone. Every step records the bytes of its
weight sync (p2p: what trainer 0's push sent, deltas with ``--delta``; Ray: the state
dict trainer 0 put), and with ``--link-mbps`` the report holds each step's ``weights``
seconds against 1.5 x bytes / link rate.

Writes ``p2p-bench-rl.json``, ``p2p-bench-rl.md`` and ``p2p-bench-rl.png`` into
``--out`` (see :mod:`p2p_worker.bench._rl_report`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from p2p_worker import Cluster, PlacementError
from p2p_worker.bench._model import SHAPES
from p2p_worker.bench._rl_actors import P2PLoop
from p2p_worker.bench._rl_ledger import account as account_ids
from p2p_worker.bench._rl_phases import MOVING, Span, account
from p2p_worker.bench._rl_placement import layout
from p2p_worker.bench._rl_policy import PLACEMENTS, STACK_CHOICES, RLSpec
from p2p_worker.bench._rl_ray import RayLoop
from p2p_worker.bench._rl_records import (
    Accounting,
    Event,
    RLMeta,
    RunExtra,
    StepRecord,
    StepResult,
    Timeline,
)
from p2p_worker.bench._rl_report import (
    JSON_NAME,
    MARKDOWN_NAME,
    PLOT_NAME,
    curve,
    describe,
    moving_ratio,
    plot,
    render_markdown,
    write_json,
)

QUICK = RLSpec(model="tiny", rollout_workers=2, steps=16, batch=16, gen_len=16, timeout=120.0)
"""``--quick``: the tiny model (about 0.1 M parameters), 2 rollout workers, 16 steps."""
MIN_STEPS_TO_LEARN = 8
"""Runs this long or longer also check that the reward rose (shorter ones are tests)."""
FULL = RLSpec()
"""The default run: the small model (about 4.9 M parameters), 4 rollout workers, 20 steps."""


class Loop(Protocol):
    """What the runner needs of a stack's loop."""

    stack: str

    def step(self, step: int) -> StepResult: ...

    def checksums(self) -> dict[str, int]: ...

    def where(self) -> dict[str, str]: ...

    def close(self) -> None: ...


def record(stack: str, step: int, start: float, result: StepResult) -> tuple[StepRecord, Timeline]:
    """The JSON record of one stack's step, and its timeline entry, from a loop's result."""
    rolled, trained, wall = result
    rows = [*(s for r in rolled for s in r["spans"]), *(s for t in trained for s in t["spans"])]
    spans = [Span(*s) for s in rows]
    # the sequences the trainers trained on, in rollout id order (= rollout rank order)
    pairs = sorted((i, x) for t in trained for i, x in zip(t["ids"], t["rewards"], strict=True))
    rewards = [x for _, x in pairs]
    phases = account(spans, wall)
    rec: StepRecord = {
        "stack": stack,
        "step": step,
        "reward": sum(rewards) / len(rewards),
        "generate": phases["generate"],
        "rollouts": phases["rollouts"],
        "train": phases["train"],
        "allreduce": phases["allreduce"],
        "weights": phases["weights"],
        "idle": phases["idle"],
        "moving": sum(phases[p] for p in MOVING),
        "step_s": wall,
        "loss": sum(t["loss"] for t in trained),
        "sequences": len(pairs),
        "dropped": sum(t.get("dropped", 0) for t in trained),
    }
    push = trained[0].get("push")  # p2p's PushReport: what the weight sync sent
    if push is not None:
        rec["weights_sent_bytes"] = push["sent_bytes"]
        rec["weights_shared_bytes"] = push["shared_bytes"]
        rec["weights_full_bytes"] = push["full_bytes"]
        rec["weights_modes"] = push["modes"]
    elif "weights_bytes" in trained[0]:  # Ray's: the state dict trainer 0 put
        rec["weights_full_bytes"] = trained[0]["weights_bytes"]
    return rec, {"step": step, "start": start, "wall": wall, "spans": [list(s) for s in spans]}


def events_of(loop: Loop) -> list[Event]:
    """The loop's lost-worker events (only the p2p loop has any)."""
    events: list[Event] = getattr(loop, "events", [])
    return events


def tallied(
    spec: RLSpec, trained: list[list[int]], records: list[StepRecord], loop: Loop
) -> Accounting:
    """A stack's rollout accounting: :func:`~p2p_worker.bench._rl_ledger.account` and more.

    Adds ``dropped`` (sequences that arrived twice and were dropped by a trainer) and
    ``resampled`` (sequences a replacement sampled again for a dead worker).
    """
    tally = account_ids(spec, trained)
    tally["dropped"] = sum(r.get("dropped", 0) for r in records if r["stack"] == loop.stack)
    events = events_of(loop)
    tally["resampled"] = spec.batch * sum(
        1 for e in events if e["event"] == "replaced" and e["resampled"]
    )
    return tally


def run_rl(
    spec: RLSpec, address: str | None = None, say: Callable[[str], None] = print
) -> tuple[list[StepRecord], dict[str, list[Timeline]], dict[str, bool], RunExtra]:
    """Run the loop on both stacks, steps interleaved.

    Returns:
        The records (one per stack and step), each stack's timeline (spans per step),
        the checks (weights bit-equal on every worker of each stack, reward curves
        equal, every rollout id trained on exactly once, a replacement caught up) and
        ``{"accounting": per stack, "events": the lost worker's}``.
    """
    base = Cluster(address=address or "local", timeout=spec.timeout)
    loops: list[Loop] = []
    records: list[StepRecord] = []
    timelines: dict[str, list[Timeline]] = {}
    checks: dict[str, bool] = {}
    accounting: dict[str, Accounting] = {}
    events: list[Event] = []
    nodes: dict[str, dict[str, str]] = {}
    try:
        plan = layout(spec.placement, spec.trainers, spec.rollout_workers, base.num_nodes)
        say(
            f"launching {spec.trainers} trainers and {spec.rollout_workers} rollout workers"
            f" per stack ({spec.placement}: trainers on node(s) {sorted(set(plan.trainers))},"
            f" rollout workers on {sorted(set(plan.rollouts))} of {base.num_nodes})"
        )
        ray_loop = RayLoop(spec, address) if "ray" in spec.stacks else None
        if ray_loop is not None:  # its actors start while p2p's groups launch
            loops.append(ray_loop)
        if "p2p" in spec.stacks:
            loops.insert(0, P2PLoop(spec, address))
            say("p2p: channel, trainer group and rollout group ready")
        if ray_loop is not None:
            ray_loop.ready()
            say("ray: queues, actors and collective group ready")
        for loop in loops:
            nodes[loop.stack] = loop.where()
            say(
                f"{loop.stack}: " + ", ".join(f"{w} on {ip}" for w, ip in nodes[loop.stack].items())
            )
        trained_ids: dict[str, list[list[int]]] = {loop.stack: [] for loop in loops}
        for step in range(1, spec.steps + 1):
            line = [f"step {step:3d}/{spec.steps}"]
            for loop in loops:
                start = time.time()
                result = loop.step(step)
                trained_ids[loop.stack] += [t["ids"] for t in result[1]]
                rec, tl = record(loop.stack, step, start, result)
                records.append(rec)
                timelines.setdefault(loop.stack, []).append(tl)
                line.append(
                    f"{loop.stack}: reward {rec['reward']:.3f} step {rec['step_s']:.3f} s"
                    f" (moving {rec['moving']:.3f} s)"
                )
                for event in events_of(loop):
                    if event["step"] == step and event["event"] == "killed":
                        rec["lost_worker"] = True
            say("  ".join(line))
            for event in [e for lp in loops for e in events_of(lp)]:
                if event["step"] == step:
                    say(f"  p2p: {describe(event)}")
        for loop in loops:
            nodes[loop.stack] = loop.where()  # at the end: a replacement's node too
            sums = loop.checksums()
            checks[
                f"{loop.stack}: every rollout worker holds the trainers' weights bit for bit"
            ] = len(set(sums.values())) == 1
            tally = tallied(spec, trained_ids[loop.stack], records, loop)
            accounting[loop.stack] = tally
            checks[
                f"{loop.stack}: every rollout id trained on exactly once (none lost, none twice)"
            ] = tally["exactly_once"]
            for event in events_of(loop):
                if event["event"] == "replaced":
                    events.append(event)
                    checks[
                        f"{loop.stack}: the replacement of rollout {event['slot']} held the"
                        f" trainers' weights at the end of step {event['step']} (caught up"
                        " within one step)"
                    ] = event["caught_up"]
                elif event["event"] == "killed":
                    events.append(event)
        if len(loops) == 2:
            checks["reward curves of p2p and ray equal bit for bit"] = curve(
                records, "p2p"
            ) == curve(records, "ray")
        if spec.placement == "spread":
            for stack, where in nodes.items():
                away = {ip for w, ip in where.items() if w.startswith("rollout")}
                checks[f"{stack}: no rollout worker on the trainers' node"] = (
                    where["trainer 0"] not in away
                )
        rewards = curve(records, loops[0].stack)
        if len(rewards) >= MIN_STEPS_TO_LEARN:
            k = len(rewards) // 4
            checks["reward rose (mean of the last quarter of steps above the first quarter's)"] = (
                sum(rewards[-k:]) / k > sum(rewards[:k]) / k
            )
    finally:
        say("stopping both stacks")
        for loop in reversed(loops):
            loop.close()
        base.shutdown()
    extra: RunExtra = {"accounting": accounting, "events": events, "nodes": nodes}
    return records, timelines, checks, extra


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``p2p-bench rl``."""
    p = argparse.ArgumentParser(
        prog="p2p-bench rl",
        description="A small RL loop (rollouts, a 2-worker trainer, weight sync every step)"
        " on p2p and on Ray's own primitives, same seeds; time per phase, reward curves.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny model, {QUICK.rollout_workers} rollout workers, {QUICK.steps} steps"
        " (about a minute on 2 cores, most of it starting the workers)",
    )
    p.add_argument("--model", choices=sorted(SHAPES), help=f"policy shapes [default: {FULL.model}]")
    p.add_argument("--rollout-workers", type=int, help=f"[default: {FULL.rollout_workers}]")
    p.add_argument("--steps", type=int, help=f"training steps [default: {FULL.steps}]")
    p.add_argument(
        "--batch", type=int, help=f"sequences per rollout worker and step [default: {FULL.batch}]"
    )
    p.add_argument("--lr", type=float, help=f"AdamW learning rate [default: {FULL.lr:g}]")
    p.add_argument("--seed", type=int, help=f"seed of weights and sampling [default: {FULL.seed}]")
    p.add_argument(
        "--delta",
        action="store_true",
        help="p2p's weight sync sends bit-level deltas (pays off when few values change)",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="one step off-policy, both stacks: the rollout workers sample step k+1 while"
        " the trainers train step k",
    )
    p.add_argument(
        "--kill-rollout",
        type=int,
        metavar="STEP",
        help="during step STEP, kill the p2p loop's last rollout worker (SIGKILL); a"
        " replacement takes its place and gets the current weights (the Ray baseline runs"
        " without the kill)",
    )
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        help="one-node: every worker on node 0; spread: the trainers on node 0, rollout"
        " worker i on node 1 + i %% (nodes - 1), both stacks (needs a multi-node cluster:"
        f" --address) [default: {FULL.placement}]",
    )
    p.add_argument(
        "--stack", choices=STACK_CHOICES, help=f"the stacks to run [default: {FULL.stack}]"
    )
    p.add_argument(
        "--link-mbps",
        type=float,
        metavar="MBPS",
        help="the rate of the links between the nodes: the report holds each step's weight"
        " sync against 1.5 x bytes / rate",
    )
    p.add_argument(
        "--out", default="p2p-bench-out", help="output folder [default: ./p2p-bench-out]"
    )
    p.add_argument("--address", help="Ray address [default: an embedded local cluster]")
    p.add_argument("--timeout", type=float, help="seconds any one blocking call may take")
    return p


def spec_from(argv: Sequence[str]) -> tuple[RLSpec, Path, str | None]:
    """Parse the command line: the spec (``--quick`` first, flags on top), out, address.

    Raises:
        SystemExit: Bad arguments (exit status 2, the message names the flag).
    """
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    base = QUICK if ns.quick else FULL
    changes = {
        "model": ns.model,
        "rollout_workers": ns.rollout_workers,
        "steps": ns.steps,
        "batch": ns.batch,
        "lr": ns.lr,
        "seed": ns.seed,
        "timeout": ns.timeout,
        "delta": ns.delta or None,
        "kill_rollout": ns.kill_rollout,
        "overlap": ns.overlap or None,
        "placement": ns.placement,
        "stack": ns.stack,
        "link_mbps": ns.link_mbps,
    }
    try:
        spec = replace(base, **{k: v for k, v in changes.items() if v is not None})
    except ValueError as exc:
        field, _, rest = str(exc).partition(":")
        parser.error(f"--{field.replace('_', '-')}:{rest}")
    return spec, Path(ns.out), ns.address


def main(argv: Sequence[str]) -> int:
    """Run ``p2p-bench rl``; write JSON, Markdown and PNG; return the exit status.

    Returns:
        0 when every check held (weights bit-equal, equal reward curves, and in runs of
        ``MIN_STEPS_TO_LEARN`` steps or more the reward rose), 1 otherwise; 2 for bad
        arguments.

    Example:
        >>> main(["--quick", "--out", "/tmp/rl-out"])  # doctest: +SKIP
        0
    """
    spec, out, address = spec_from(argv)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"p2p-bench rl: error: --out: cannot create {str(out)!r}: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    print(
        f"p2p-bench rl: {spec.model} policy ({spec.shape.parameter_count():,} parameters),"
        f" {spec.rollout_workers} rollout workers x {spec.batch} sequences, {spec.trainers}"
        f" trainers, {spec.steps} steps, "
        + (" and ".join(spec.stacks) + " interleaved" if spec.stack == "both" else spec.stack)
        + f", placement {spec.placement}"
    )
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {text}", flush=True)

    try:
        records, timelines, checks, extra = run_rl(spec, address, say)
    except PlacementError as exc:
        print(f"p2p-bench rl: error: {exc}", file=sys.stderr)
        return 2
    meta: RLMeta = {
        "command": "p2p-bench rl",
        "model": spec.model,
        "parameters": spec.shape.parameter_count(),
        "rollout_workers": spec.rollout_workers,
        "trainers": spec.trainers,
        "sequences per step": spec.rollout_workers * spec.batch,
        "steps": spec.steps,
        "lr": spec.lr,
        "seed": spec.seed,
        "weight deltas": spec.delta,
        "overlap": spec.overlap,
        "placement": spec.placement,
        "stacks": "+".join(spec.stacks),
        "wall_s": round(time.time() - started, 1),
    }
    if spec.link_mbps is not None:
        meta["link Mbit/s"] = spec.link_mbps
    if spec.kill_rollout is not None:
        meta["p2p rollout worker killed in step"] = spec.kill_rollout
    drew = plot(records, timelines, out / PLOT_NAME)
    payload = {"meta": meta, "checks": checks, **extra, "timelines": timelines}
    write_json(out / JSON_NAME, records, payload)
    report = render_markdown(records, {**meta, "plot": drew, "checks": checks, **extra})
    (out / MARKDOWN_NAME).write_text(report, encoding="utf-8")
    print(report)
    if spec.stack == "both":
        print(f"data movement per step, ray / p2p: {moving_ratio(records):.2f}x")
    print(
        f"wrote {out / JSON_NAME}, {out / MARKDOWN_NAME}" + (f", {out / PLOT_NAME}" if drew else "")
    )
    failed = [name for name, ok in checks.items() if not ok]
    for name in failed:
        print(f"CHECK FAILED: {name}")
    return 1 if failed else 0
