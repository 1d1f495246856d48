"""The learning part of ``p2p-bench rl``: policy, sampling, reward and policy-gradient loss.

Nothing here moves data: both stacks of the benchmark (p2p and Ray's own primitives) run
exactly these functions, so whatever differs between their runs is the transport.

The policy is the benchmark's decoder (:class:`~p2p_worker.bench._model.Decoder`, shapes
from :data:`~p2p_worker.bench._model.SHAPES`), randomly initialised from the seed. A
rollout worker samples ``batch`` sequences per step: a random prompt of ``prompt_len``
tokens, then ``gen_len`` tokens drawn one by one from the policy. The reward is
verifiable and needs no model: the fraction of generated tokens that fall in the target
set, the lowest eighth of the vocabulary (about 1/8 for a random policy, 1 for a policy
that learned the task). The trainer takes a REINFORCE step with a group-relative
baseline: each rollout worker's sequences of a step form one group, and a sequence's
advantage is its reward minus the group's mean, divided by the group's spread.

Every random draw comes from a generator seeded by ``(seed, step, rank)`` and every
process runs torch on one thread, so two runs with the same seeds and the same weights
produce the same tokens, rewards and gradients bit for bit.

Example:
    >>> spec = RLSpec(model="tiny", rollout_workers=2, steps=2, batch=4, gen_len=4)
    >>> policy = new_policy(spec)
    >>> item = sample(policy, spec, step=1, rank=0)
    >>> item["tokens"].shape, item["rewards"].shape
    (torch.Size([4, 8]), torch.Size([4]))
    >>> learner = Learner(spec)
    >>> grads = learner.backward(order_batch([item], spec))
    >>> learner.apply(grads)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict, cast

import torch
import torch.nn.functional as F

from p2p_worker.bench._model import SHAPES, Decoder, DecoderShape

STACK_CHOICES = ("both", "p2p", "ray")
"""The values of ``--stack``."""
PLACEMENTS = ("one-node", "spread")
"""The values of ``--placement`` (:mod:`p2p_worker.bench._rl_placement`)."""
TARGET_FRACTION = 8
"""The target set is the lowest ``vocab // TARGET_FRACTION`` token ids."""


class RLSpecFields(TypedDict):
    """An :class:`RLSpec` as plain values (:meth:`RLSpec.as_dict`): ``RLSpec(**fields)``."""

    model: str
    rollout_workers: int
    trainers: int
    steps: int
    batch: int
    prompt_len: int
    gen_len: int
    lr: float
    seed: int
    timeout: float
    delta: bool
    kill_rollout: int | None
    overlap: bool
    placement: str
    stack: str
    link_mbps: float | None


@dataclass(frozen=True)
class RLSpec:
    """What one run of the RL loop does (the same for both stacks).

    Attributes:
        model: A key of :data:`~p2p_worker.bench._model.SHAPES`.
        rollout_workers: Workers sampling sequences (N).
        trainers: Workers training on the rollouts, averaging gradients (at most N).
        steps: Training steps (one batch of rollouts and one weight sync each).
        batch: Sequences each rollout worker samples per step.
        prompt_len: Random prompt tokens before the generated ones.
        gen_len: Tokens generated per sequence.
        lr: AdamW learning rate.
        seed: Seed of the initial weights and of every draw.
        timeout: Seconds any one blocking call of the loop may take.
        delta: Whether p2p's weight sync sends bit-level deltas (``push_weights(...,
            delta=True)``). Off by default: with fp32 weights and AdamW every value
            changes every step, so a delta is nearly as large as the weights and costs
            more to make than it saves (measured in ``docs/concepts/rl-loop.rst``).
        kill_rollout: The step during which the p2p loop kills its last rollout worker
            (SIGKILL) and a replacement takes its place (None: no kill). The Ray
            baseline runs without the kill.
        overlap: One step off-policy: while the trainers train step k, the rollout
            workers sample step k+1 with the weights they hold, those of step k-1
            (:meth:`sampled_in`); both stacks.
        placement: ``one-node`` (every worker on node 0) or ``spread`` (the trainers on
            node 0, rollout worker i on node 1 + i % (N - 1));
            :mod:`p2p_worker.bench._rl_placement`.
        stack: The stacks to run: ``both``, ``p2p`` or ``ray``.
        link_mbps: The rate of the links between the nodes in Mbit/s, if known: the
            report holds each step's weight sync against 1.5 x bytes / rate (the loop
            does not use it).
    """

    model: str = "small"
    rollout_workers: int = 4
    trainers: int = 2
    steps: int = 20
    batch: int = 16
    prompt_len: int = 4
    gen_len: int = 16
    lr: float = 1e-2
    seed: int = 0
    timeout: float = 300.0
    delta: bool = False
    kill_rollout: int | None = None
    overlap: bool = False
    placement: str = "one-node"
    stack: str = "both"
    link_mbps: float | None = None

    def __post_init__(self) -> None:
        if self.model not in SHAPES:
            raise ValueError(f"model: got {self.model!r}; allowed: {', '.join(sorted(SHAPES))}")
        for name in ("rollout_workers", "trainers", "steps", "batch", "prompt_len", "gen_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: got {value!r}; allowed: an int >= 1")
        if self.trainers > self.rollout_workers:
            raise ValueError(
                f"rollout_workers: got {self.rollout_workers}; allowed: at least the number"
                f" of trainers ({self.trainers}), so that every trainer gets rollouts"
            )
        if not self.lr > 0:
            raise ValueError(f"lr: got {self.lr!r}; allowed: a number > 0")
        if not self.timeout > 0:
            raise ValueError(f"timeout: got {self.timeout!r}; allowed: seconds > 0")
        k = self.kill_rollout
        if k is not None and (
            isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.steps
        ):
            raise ValueError(
                f"kill_rollout: got {k!r}; allowed: a step in 1..{self.steps} (--steps)"
            )
        if k is not None and self.overlap:
            raise ValueError(f"kill_rollout: got {k!r}; allowed: no kill with --overlap")
        if self.placement not in PLACEMENTS:
            allowed = ", ".join(PLACEMENTS)
            raise ValueError(f"placement: got {self.placement!r}; allowed: {allowed}")
        if self.stack not in STACK_CHOICES:
            raise ValueError(f"stack: got {self.stack!r}; allowed: {', '.join(STACK_CHOICES)}")
        rate = self.link_mbps
        if rate is not None and (isinstance(rate, bool) or not rate > 0):
            raise ValueError(f"link_mbps: got {rate!r}; allowed: Mbit/s > 0")
        if k is not None and self.stack == "ray":
            raise ValueError(f"kill_rollout: got {k!r}; allowed: no kill with --stack ray")

    @property
    def stacks(self) -> tuple[str, ...]:
        """The stacks the run runs, p2p first."""
        return ("p2p", "ray") if self.stack == "both" else (self.stack,)

    @property
    def shape(self) -> DecoderShape:
        """The policy's shapes."""
        return SHAPES[self.model]

    def as_dict(self) -> RLSpecFields:
        """The spec as plain values (it travels to the workers this way)."""
        return cast("RLSpecFields", asdict(self))

    def sources_of(self, trainer: int) -> list[int]:
        """The rollout workers whose sequences trainer ``trainer`` trains on."""
        return [r for r in range(self.rollout_workers) if r % self.trainers == trainer]

    def trainer_of(self, rollout: int) -> int:
        """The trainer that trains on rollout worker ``rollout``'s sequences."""
        return rollout % self.trainers

    def sampled_in(self, step: int) -> list[int]:
        """The steps whose rollouts the rollout workers sample during step ``step``.

        Without overlap, ``step`` itself. With it, the next step (both 1 and 2 during
        step 1, none during the last): rollouts of step s are sampled with the weights
        of step s-2 (the initial ones for steps 1 and 2).

        Example:
            >>> spec = RLSpec(model="tiny", steps=3, overlap=True)
            >>> [spec.sampled_in(s) for s in (1, 2, 3)]
            [[1, 2], [3], []]
        """
        if not self.overlap:
            return [step]
        return [s for s in ([1, 2] if step == 1 else [step + 1]) if s <= self.steps]

    @property
    def victim(self) -> int:
        """The rollout worker that ``kill_rollout`` kills: the last one."""
        return self.rollout_workers - 1


def pin_threads() -> None:
    """One torch thread in this process: the same arithmetic in every run (and 2 cores)."""
    torch.set_num_threads(1)


def new_policy(spec: RLSpec) -> Decoder:
    """The policy at step 0: the decoder of ``spec.model`` from ``spec.seed``, fp32."""
    return Decoder(spec.shape, seed=spec.seed)


def policy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by name (a tied one once), detached, not copied."""
    return {name: p.detach() for name, p in model.named_parameters()}


def reward(generated: torch.Tensor, vocab: int) -> torch.Tensor:
    """The fraction of each row's tokens that fall in the target set (float32, per row).

    Args:
        generated: ``(batch, tokens)`` token ids.
        vocab: The vocabulary size; the target set is ids below ``vocab // 8``.

    Example:
        >>> reward(torch.tensor([[0, 1, 500, 63], [64, 64, 64, 64]]), vocab=512)
        tensor([0.7500, 0.0000])
    """
    below = max(1, vocab // TARGET_FRACTION)
    return (generated < below).to(torch.float32).mean(dim=1)


def rollout_key(spec: RLSpec, first_id: int) -> tuple[int, int]:
    """``(step, rank)`` of the item whose first rollout id is ``first_id`` (see below).

    Example:
        >>> spec = RLSpec(model="tiny", rollout_workers=2, batch=4)
        >>> rollout_key(spec, 12)
        (2, 1)
    """
    group = first_id // spec.batch
    return group // spec.rollout_workers + 1, group % spec.rollout_workers


def rollout_ids(spec: RLSpec, step: int, rank: int) -> torch.Tensor:
    """The ids of the sequences rollout worker ``rank`` samples at ``step`` (unique in a run)."""
    first = ((step - 1) * spec.rollout_workers + rank) * spec.batch
    return torch.arange(first, first + spec.batch, dtype=torch.int64)


@torch.no_grad()
def sample(model: torch.nn.Module, spec: RLSpec, step: int, rank: int) -> dict[str, torch.Tensor]:
    """Sample rollout worker ``rank``'s sequences of ``step`` from ``model``, with rewards.

    Returns:
        One item for the trainer: ``ids`` (int64, ``batch``), ``tokens`` (int64, ``batch``
        x ``prompt_len + gen_len``), ``rewards`` (float32, ``batch``).
    """
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + step * 1_009 + rank)
    vocab = spec.shape.vocab
    tokens = torch.randint(0, vocab, (spec.batch, spec.prompt_len), generator=gen)
    for _ in range(spec.gen_len):
        logits = model(tokens)[:, -1].float()
        nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=gen)
        tokens = torch.cat([tokens, nxt], dim=1)
    return {
        "ids": rollout_ids(spec, step, rank),
        "tokens": tokens,
        "rewards": reward(tokens[:, spec.prompt_len :], vocab),
    }


def warmup_item(spec: RLSpec, rank: int) -> dict[str, torch.Tensor]:
    """An item shaped like rank ``rank``'s rollouts, ids negative: it builds the links."""
    return {
        "ids": -1 - torch.arange(spec.batch, dtype=torch.int64) - rank * spec.batch,
        "tokens": torch.zeros((spec.batch, spec.prompt_len + spec.gen_len), dtype=torch.int64),
        "rewards": torch.zeros(spec.batch),
    }


def order_batch(
    items: Sequence[Mapping[str, torch.Tensor]], spec: RLSpec
) -> dict[str, torch.Tensor]:
    """Join items into one batch ordered by rollout id, whatever order they arrived in.

    Raises:
        ValueError: An item lacks a field, or the same rollout id arrived twice.
    """
    if not items:
        raise ValueError("items: got none; allowed: at least one rollout item")
    for item in items:
        missing = {"ids", "tokens", "rewards"} - set(item)
        if missing:
            raise ValueError(f"rollout item: missing {sorted(missing)}; got keys {sorted(item)}")
    ids = torch.cat([it["ids"] for it in items])
    distinct = len(set(ids.tolist()))
    if distinct != ids.numel():
        raise ValueError(f"rollout ids: {ids.numel() - distinct} arrived twice")
    order = torch.argsort(ids)
    return {
        "ids": ids[order],
        "tokens": torch.cat([it["tokens"] for it in items])[order],
        "rewards": torch.cat([it["rewards"] for it in items])[order],
    }


def advantages(ids: torch.Tensor, rewards: torch.Tensor, group: int) -> torch.Tensor:
    """Group-relative advantages: reward minus its group's mean, over the group's spread.

    A group is the ``group`` sequences one rollout worker sampled in one step (their ids
    share ``id // group``).
    """
    keys = ids // group
    adv = torch.empty_like(rewards)
    for key in sorted(set(keys.tolist())):
        rows = keys == key
        r = rewards[rows]
        spread = r.std(unbiased=False) if r.numel() > 1 else torch.tensor(0.0)
        adv[rows] = (r - r.mean()) / (spread + 1e-6)
    return adv


def policy_loss(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor], spec: RLSpec
) -> torch.Tensor:
    """REINFORCE loss of ``batch``, scaled for summing over trainers.

    Every trainer divides by all generated tokens of the step, so the trainers' summed
    gradients are the gradient of the whole step's mean loss.
    """
    tokens = batch["tokens"]
    p = spec.prompt_len
    adv = advantages(batch["ids"], batch["rewards"], spec.batch)
    logp = F.log_softmax(model(tokens[:, :-1]).float(), dim=-1)[:, p - 1 :]
    taken = logp.gather(-1, tokens[:, p:, None])[..., 0]
    total = spec.rollout_workers * spec.batch * spec.gen_len
    return -(adv[:, None] * taken).sum() / total


class Learner:
    """A trainer's policy and optimizer: gradients out as one flat tensor, summed ones in.

    Args:
        spec: The run's spec (model, seed, learning rate).
    """

    def __init__(self, spec: RLSpec) -> None:
        self.spec = spec
        self.model = new_policy(spec)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.lr, weight_decay=0.0)
        self.numel = sum(p.numel() for p in self.params)
        self.last_loss = float("nan")

    def backward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward and backward on ``batch``; this trainer's gradients as one flat fp32 tensor."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = policy_loss(self.model, batch, self.spec)
        loss.backward()  # type: ignore[no-untyped-call]
        self.last_loss = float(loss.detach())
        return torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params
            ]
        )

    def apply(self, flat: torch.Tensor) -> None:
        """Take one optimizer step with the summed gradients ``flat`` (from :meth:`backward`).

        Raises:
            ValueError: ``flat`` does not hold one value per parameter.
        """
        if flat.numel() != self.numel:
            raise ValueError(f"flat: got {flat.numel()} values; allowed: {self.numel}")
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        self.optimizer.step()


@torch.no_grad()
def load_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model``'s own parameters, in place.

    Raises:
        ValueError: The names differ from the model's.
    """
    own = policy_state(model)
    if sorted(own) != sorted(state):
        raise ValueError(f"state: names differ from the policy's: {sorted(set(own) ^ set(state))}")
    for name, t in own.items():
        t.copy_(state[name])
