"""The payloads a benchmark moves, built from realistic, deterministic data.

Compression results depend entirely on the bytes, so every payload is made of data
that looks like what RL and training jobs really send, and the report states it
(:data:`DATA_DESCRIPTION`):

* token ids: int64, values below a 32,000-token vocabulary, log-uniform (Zipf-like)
  so small ids are frequent, the way real text is;
* weights: bfloat16 drawn from N(0, 0.02), the usual initialisation scale;
* sparse float32: 90% exact zeros, the rest N(0, 1) (a masked / top-k update);
* dense float32: log-probabilities, ``-Exp(1)`` (high entropy, barely compressible);
* attention mask: int64 ones with right padding zeros (a quarter of each row).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, fields, is_dataclass
from typing import Final, TypedDict

import torch

VOCAB: Final = 32_000
SEQ: Final = 1024
SPARSITY: Final = 0.9

DATA_DESCRIPTION: Final = {
    "tensor": "one int64 tensor of token ids (vocabulary 32,000, Zipf-like), shape (n/1024, 1024)",
    "tensor_list": "list of 4 bfloat16 weight shards, N(0, 0.02)",
    "tensor_dict": (
        "dict: input_ids int64 token ids (1/2 of the bytes), attention_mask int64 right-padded"
        " (1/4), rewards float32 90% zeros (1/4)"
    ),
    "dataclass": (
        "RolloutBatch dataclass: tokens int64 token ids (1/2), logprobs dense float32 (1/4),"
        " advantages float32 90% zeros (1/4)"
    ),
    "object": "a small control dict (step, worker name, a 400-character prompt, 16 rewards)",
}


@dataclass
class RolloutBatch:
    """The ``dataclass`` payload kind: a dataclass whose fields are tensors plus a tag.

    Attributes:
        tokens: int64 token ids.
        logprobs: dense float32 log-probabilities.
        advantages: float32, mostly zeros.
        step: a plain int field, carried by pickling alongside the tensors.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    step: int = 0


def _numel(nbytes: int, dtype: torch.dtype) -> int:
    return max(1, nbytes // dtype.itemsize)


def _shape(numel: int) -> tuple[int, ...]:
    return (numel // SEQ, SEQ) if numel % SEQ == 0 and numel >= SEQ else (numel,)


def token_ids(nbytes: int, gen: torch.Generator) -> torch.Tensor:
    """Int64 token ids, log-uniform over ``[0, VOCAB)``, about ``nbytes`` bytes."""
    n = _numel(nbytes, torch.int64)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    ids = torch.exp(u * torch.log(torch.tensor(float(VOCAB), dtype=torch.float64))) - 1.0
    return ids.to(torch.int64).clamp_(0, VOCAB - 1).reshape(_shape(n))


def bf16_weights(nbytes: int, gen: torch.Generator) -> torch.Tensor:
    """Bfloat16 weights from N(0, 0.02), about ``nbytes`` bytes."""
    n = _numel(nbytes, torch.bfloat16)
    return (torch.randn(n, generator=gen) * 0.02).to(torch.bfloat16).reshape(_shape(n))


def sparse_f32(nbytes: int, gen: torch.Generator) -> torch.Tensor:
    """Float32 with ``SPARSITY`` exact zeros, the rest N(0, 1)."""
    n = _numel(nbytes, torch.float32)
    values = torch.randn(n, generator=gen)
    values[torch.rand(n, generator=gen) < SPARSITY] = 0.0
    return values.reshape(_shape(n))


def dense_logprobs(nbytes: int, gen: torch.Generator) -> torch.Tensor:
    """Dense float32 log-probabilities (``-Exp(1)``)."""
    n = _numel(nbytes, torch.float32)
    return torch.log(torch.rand(n, generator=gen).clamp_(min=1e-12)).reshape(_shape(n))


def attention_mask(nbytes: int) -> torch.Tensor:
    """Int64 mask: ones with the last quarter of each row zero (right padding)."""
    n = _numel(nbytes, torch.int64)
    mask = torch.ones(_shape(n), dtype=torch.int64)
    width = mask.shape[-1]
    mask[..., width - width // 4 :] = 0
    return mask


class ControlMessage(TypedDict):
    """The ``object`` payload kind: a small control message, no tensors."""

    step: int
    worker: str
    prompt: str
    rewards: list[float]
    done: bool


Payload = (
    torch.Tensor | list[torch.Tensor] | dict[str, torch.Tensor] | RolloutBatch | ControlMessage
)
"""A payload of one of the kinds (:func:`make_payload`)."""


def small_object(seed: int = 0) -> ControlMessage:
    """The ``object`` payload: a small control message."""
    return {
        "step": 1000 + seed,
        "worker": "Worker_group_Rollout:0",
        "prompt": ("Explain why the sky is blue in one paragraph. " * 9)[:400],
        "rewards": [0.25 * i for i in range(16)],
        "done": False,
    }


def make_payload(kind: str, nbytes: int, seed: int = 0) -> Payload:
    """Build the payload of ``kind`` holding about ``nbytes`` bytes of tensor data.

    The same ``(kind, nbytes, seed)`` always gives the same values, so a receiver can
    build the expected payload itself and check what arrived.

    Args:
        kind: one of the kinds in :data:`p2p_worker.bench._spec.KINDS`.
        nbytes: total tensor bytes (ignored for ``object``).
        seed: random seed.

    Returns:
        A tensor, list of tensors, dict of tensors, :class:`RolloutBatch` or dict.

    Raises:
        ValueError: an unknown kind.

    Example:
        >>> payload = make_payload("tensor", 8192)
        >>> payload.dtype, payload.numel() * payload.element_size()
        (torch.int64, 8192)
    """
    gen = torch.Generator().manual_seed(seed)
    if kind == "tensor":
        return token_ids(nbytes, gen)
    if kind == "tensor_list":
        return [bf16_weights(nbytes // 4, gen) for _ in range(4)]
    if kind == "tensor_dict":
        return {
            "input_ids": token_ids(nbytes // 2, gen),
            "attention_mask": attention_mask(nbytes // 4),
            "rewards": sparse_f32(nbytes // 4, gen),
        }
    if kind == "dataclass":
        return RolloutBatch(
            tokens=token_ids(nbytes // 2, gen),
            logprobs=dense_logprobs(nbytes // 4, gen),
            advantages=sparse_f32(nbytes // 4, gen),
            step=seed,
        )
    if kind == "object":
        return small_object(seed)
    raise ValueError(f"kind: got {kind!r}; allowed: {', '.join(DATA_DESCRIPTION)}")


def payload_tensors(payload: object) -> list[torch.Tensor]:
    """The tensors of a payload in wire order (empty for a plain object)."""
    if isinstance(payload, torch.Tensor):
        return [payload]
    if isinstance(payload, (list, tuple)):
        return [t for t in payload if isinstance(t, torch.Tensor)]
    if isinstance(payload, dict):
        return [v for v in payload.values() if isinstance(v, torch.Tensor)]
    if is_dataclass(payload) and not isinstance(payload, type):
        values = (getattr(payload, f.name) for f in fields(payload))
        return [v for v in values if isinstance(v, torch.Tensor)]
    return []


def payload_nbytes(payload: object) -> int:
    """Logical bytes of a payload: tensor bytes, or the pickled size of a plain object."""
    tensors = payload_tensors(payload)
    if tensors:
        return sum(t.numel() * t.element_size() for t in tensors)
    return len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))


def payloads_equal(a: object, b: object) -> bool:
    """Exact equality of two payloads (tensors bit for bit, same structure and dtypes)."""
    ta, tb = payload_tensors(a), payload_tensors(b)
    if not ta and not tb:
        return bool(a == b)
    if type(a) is not type(b) or len(ta) != len(tb):
        return False
    if isinstance(a, dict) and (not isinstance(b, dict) or list(a) != list(b)):
        return False
    return all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        for x, y in zip(ta, tb, strict=True)
    )
