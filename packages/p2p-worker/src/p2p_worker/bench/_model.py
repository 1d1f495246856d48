"""A decoder-only language model in plain torch, built from a real model's shapes.

The weight-sync benchmark and the RL example need model-shaped weights and real
optimizer steps without downloading anything: :class:`Decoder` builds the usual modern
decoder (token embedding, pre-norm blocks of grouped-query attention and a gated MLP,
RMS norms, an output head tied to the embedding) from a :class:`DecoderShape`, randomly
initialised. :class:`WeightSteps` keeps fp32 master weights, takes real AdamW steps on
synthetic next-token data and hands out the bf16 copy a trainer would send to its rollout
workers after each step.

Example:
    >>> shape = SHAPES["tiny"]
    >>> steps = WeightSteps(shape, lr=1e-5, seed=0)
    >>> before = steps.weights()
    >>> after = steps.step()
    >>> sorted(after) == sorted(before) and after["embed.weight"].dtype == torch.bfloat16
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DecoderShape:
    """The shapes of a decoder-only model.

    Attributes:
        name: What the shapes are named after.
        vocab: Vocabulary size (rows of the embedding).
        hidden: Width of the residual stream.
        layers: Number of blocks.
        heads: Query heads per attention layer.
        kv_heads: Key/value heads (grouped-query attention); divides ``heads``.
        intermediate: Width of the gated MLP.
        tied: Whether the output head shares the embedding's weight.
    """

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool = True

    def __post_init__(self) -> None:
        for field in ("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}: got {value!r}; allowed: an int >= 1")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"heads/kv_heads: hidden {self.hidden} must divide into heads {self.heads}, "
                f"and heads into kv_heads {self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    def parameter_count(self) -> int:
        """Parameters of the model (a tied head counted once)."""
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * (self.hidden + 2 * kv) + (self.hidden + 2 * kv)  # q, k, v + bias
        attn += self.hidden * self.hidden  # o
        mlp = 3 * self.hidden * self.intermediate
        block = attn + mlp + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * block + self.hidden + head


SHAPES = {
    # The published shapes of Qwen2.5-0.5B (about 0.49 B parameters, 0.99 GB in bf16).
    "qwen2.5-0.5b": DecoderShape("qwen2.5-0.5b", 151_936, 896, 24, 14, 2, 4_864),
    # A few million parameters with the same structure, for quick runs and tests.
    "small": DecoderShape("small", 8_192, 256, 4, 8, 2, 704),
    "tiny": DecoderShape("tiny", 512, 64, 2, 4, 2, 128),
}
"""Named shapes: ``qwen2.5-0.5b`` (the real config's shapes), ``small`` and ``tiny``."""


class _Attention(nn.Module):
    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        kv = shape.kv_heads * shape.head_dim
        self.shape = shape
        self.q = nn.Linear(shape.hidden, shape.hidden)
        self.k = nn.Linear(shape.hidden, kv)
        self.v = nn.Linear(shape.hidden, kv)
        self.o = nn.Linear(shape.hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        s = self.shape
        q = self.q(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        groups = s.heads // s.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.o(y.transpose(1, 2).reshape(b, t, s.hidden))
        return out


class _Block(nn.Module):
    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(shape.hidden)
        self.attn = _Attention(shape)
        self.mlp_norm = nn.RMSNorm(shape.hidden)
        self.gate = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return out


class Decoder(nn.Module):
    """A decoder-only language model of the given shapes, randomly initialised.

    Args:
        shape: The model's shapes.
        seed: Seed of the initialisation (same seed, same weights on any machine).
    """

    def __init__(self, shape: DecoderShape, seed: int = 0) -> None:
        super().__init__()
        self.shape = shape
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(shape.vocab, shape.hidden)
            nn.init.normal_(self.embed.weight, std=0.02)
            self.blocks = nn.ModuleList(_Block(shape) for _ in range(shape.layers))
            self.norm = nn.RMSNorm(shape.hidden)
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits, ``(batch, time, vocab)``, for ``(batch, time)`` token ids."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out


class WeightSteps:
    """fp32 master weights taking real AdamW steps; the bf16 copy after each step.

    Each step trains on a fresh batch of synthetic next-token data (a fixed random
    "language": each token is followed by one of a few tokens), so the loss falls and the
    weights move as in real training: at lr 1e-6 a few percent of the bf16 values change
    per step, at 1e-5 more.

    Args:
        shape: The model's shapes.
        lr: AdamW learning rate.
        seed: Seed of the weights and of the data.
        batch: Sequences per step.
        seq_len: Tokens per sequence.
        dtype: The dtype of the copy :meth:`weights` hands out.
    """

    def __init__(
        self,
        shape: DecoderShape,
        lr: float,
        seed: int = 0,
        batch: int = 2,
        seq_len: int = 32,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr: got {lr!r}; allowed: a number > 0")
        self.model = Decoder(shape, seed)
        # foreach=False: the multi-tensor path allocates temporaries the size of the model,
        # which a 0.5B model's trainer beside seven rollout workers cannot spare on 24 GB.
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=0.0, foreach=False
        )
        self.dtype = dtype
        self.batch = batch
        self.seq_len = seq_len
        self._gen = torch.Generator().manual_seed(seed + 1)
        self._next = torch.randint(0, shape.vocab, (shape.vocab, 4), generator=self._gen)
        self.steps = 0
        self.last_loss = float("nan")

    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights in :attr:`dtype`, one tensor per name (tied ones once)."""
        return {name: p.detach().to(self.dtype) for name, p in self.model.named_parameters()}

    def _batch(self) -> torch.Tensor:
        shape = self.model.shape
        rows = torch.empty((self.batch, self.seq_len + 1), dtype=torch.long)
        rows[:, 0] = torch.randint(0, shape.vocab, (self.batch,), generator=self._gen)
        pick = torch.randint(0, 4, (self.batch, self.seq_len), generator=self._gen)
        for t in range(self.seq_len):
            rows[:, t + 1] = self._next[rows[:, t], pick[:, t]]
        return rows

    def step(self) -> dict[str, torch.Tensor]:
        """One AdamW step on a fresh batch; return the new weights (see :meth:`weights`)."""
        self.train()
        return self.weights()

    def refresh(self, current: dict[str, torch.Tensor]) -> float:
        """Write the weights in :attr:`dtype` into ``current`` in place; the changed fraction.

        ``current`` is what :meth:`weights` returned before; no second copy of the model
        is made (a 0.5B model's trainer beside seven rollout workers is short of memory).
        """
        changed = total = 0
        for name, p in self.model.named_parameters():
            new, old = p.detach().to(self.dtype), current[name]
            width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            bits = width[old.element_size()]
            changed += int((old.view(bits) != new.view(bits)).sum())
            total += old.numel()
            old.copy_(new)
        return changed / total if total else 0.0

    def train(self) -> None:
        """One AdamW step on a fresh batch (the fp32 masters change; nothing is copied)."""
        rows = self._batch()
        logits = self.model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held between steps
        self.steps += 1
        self.last_loss = float(loss.detach())

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            yield self.step()


def changed_fraction(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> float:
    """The fraction of values whose bits differ between two state dicts of equal shapes."""
    changed = 0
    total = 0
    for name, a in old.items():
        b = new[name]
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        changed += int((a.view(width) != b.view(width)).sum())
        total += a.numel()
    return changed / total if total else 0.0
