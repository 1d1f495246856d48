"""The bucket layout of a state dict: the target's keys, shapes and dtypes cut into buckets.

A target describes its own tensors (key order, shape, dtype; tied tensors once) as
:class:`Entry` s; source and target then cut the same entries into the same flat
buckets, so that a bucket is one contiguous run of values of one dtype that both sides
agree on without sending any per-tensor metadata. A tensor larger than a bucket is split
over several buckets, so no buffer is ever larger than ``bucket_bytes``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

DEFAULT_BUCKET_BYTES = 32 << 20
"""The largest automatic bucket size: 32 MiB of the targets' dtype."""
MIN_AUTO_BUCKET_BYTES = 2 << 20
"""The smallest automatic bucket size when every target is on the source's node: 2 MiB."""
AUTO_BUCKETS = 16
"""An automatic bucket size aims at this many buckets per model (see :func:`auto_bucket_bytes`)."""
MIN_RELAY_BUCKET_BYTES = 512 << 10
"""The smallest automatic bucket size when the relay crosses a network: 512 KiB."""
RELAY_BUCKETS = 32
"""Buckets per model an automatic size aims at when the relay crosses a network."""
FEW_BUCKETS = 4
"""Buckets per model an automatic size aims at when every target reads the source's arena,
or when the relay crosses a network and the sync keeps a delta base."""


@dataclass(frozen=True)
class Entry:
    """One tensor a target receives: its key, shape and dtype (the target's own)."""

    key: str
    shape: tuple[int, ...]
    dtype: str  # str(torch.dtype), e.g. "torch.bfloat16"

    @property
    def numel(self) -> int:
        """Number of values."""
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Segment:
    """A run of ``count`` values of entry ``entry`` from ``start``, at ``offset`` in its bucket."""

    entry: int
    start: int
    count: int
    offset: int


@dataclass(frozen=True)
class Bucket:
    """One flat buffer of one dtype: its segments in order."""

    index: int
    dtype: torch.dtype
    numel: int
    segments: tuple[Segment, ...]
    frozen: bool

    @property
    def nbytes(self) -> int:
        """Size of the bucket's buffer in bytes."""
        return self.numel * _itemsize(self.dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype of ``str(dtype)`` (``"torch.bfloat16"``)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype: {name!r} is not a torch dtype")
    return dtype


@dataclass
class _OpenBucket:
    """A bucket :meth:`Layout.build` is still filling."""

    index: int
    numel: int
    segments: list[Segment]


@dataclass(frozen=True)
class Layout:
    """The entries of a target cut into buckets of at most ``bucket_bytes``.

    Attributes:
        entries: The tensors, in the target's key order (tied duplicates left out).
        buckets: The buckets; a new one opens per dtype (and frozen-ness) as the previous
            one of that kind fills up.
        bucket_bytes: The bucket size used.
        digest: A hash of all of the above: equal digests mean equal buckets.
    """

    entries: tuple[Entry, ...]
    buckets: tuple[Bucket, ...]
    bucket_bytes: int
    digest: str

    @classmethod
    def build(
        cls, entries: Sequence[Entry], bucket_bytes: int, frozen: Iterable[str] = ()
    ) -> Layout:
        """Cut ``entries`` into buckets (frozen entries into buckets of their own).

        A sync builds the same layout at every push, on the source and on every target,
        so the last few layouts built are kept (they are immutable) and handed out again:
        building one for a 50-tensor model took 0.3-0.8 ms, on the path to the first
        bucket on both sides.

        Raises:
            ValueError: ``bucket_bytes`` is below 1 KiB.
        """
        check_bucket_bytes(bucket_bytes)
        return _built(tuple(entries), bucket_bytes, frozenset(frozen))

    @classmethod
    def _cut(cls, entries: tuple[Entry, ...], bucket_bytes: int, frozen: frozenset[str]) -> Layout:
        frozen_keys = set(frozen)
        open_: dict[tuple[str, bool], _OpenBucket] = {}  # kind -> the bucket being filled
        done: list[tuple[int, torch.dtype, int, tuple[Segment, ...], bool]] = []
        counter = 0
        for i, e in enumerate(entries):
            dtype = dtype_of(e.dtype)
            cap = max(1, bucket_bytes // _itemsize(dtype))
            kind = (e.dtype, e.key in frozen_keys)
            start, left = 0, e.numel
            while left > 0:
                cur = open_.get(kind)
                if cur is None:
                    cur = open_[kind] = _OpenBucket(counter, 0, [])
                    counter += 1
                take = min(left, cap - cur.numel)
                cur.segments.append(Segment(i, start, take, cur.numel))
                cur.numel += take
                start += take
                left -= take
                if cur.numel == cap:
                    done.append((cur.index, dtype, cur.numel, tuple(cur.segments), kind[1]))
                    del open_[kind]
        for (name, fro), cur in open_.items():
            done.append((cur.index, dtype_of(name), cur.numel, tuple(cur.segments), fro))
        done.sort(key=lambda b: b[0])
        buckets = tuple(Bucket(i, d, n, s, f) for i, d, n, s, f in done)
        text = repr((tuple(entries), bucket_bytes, sorted(frozen_keys)))
        digest = hashlib.sha256(text.encode()).hexdigest()[:32]
        return cls(tuple(entries), buckets, bucket_bytes, digest)


@functools.lru_cache(maxsize=8)
def _built(entries: tuple[Entry, ...], bucket_bytes: int, frozen: frozenset[str]) -> Layout:
    """:meth:`Layout.build`'s cut, kept for the next push of the same model."""
    return Layout._cut(entries, bucket_bytes, frozen)


def auto_bucket_bytes(
    entries: Sequence[Entry], network: bool = False, shared: bool = False, delta: bool = False
) -> int:
    """The bucket size used when none is set: a power of two, at most 32 MiB.

    A relay is a pipeline of buckets: with ``B`` buckets through a chain of ``N``
    targets the last one has the model after about ``(B + N - 1) / B`` times the time of
    one hop, so a model must span many buckets for the chain to cost little more than one
    copy (30 buckets of 32 MiB for a 1 GB model: 1.2x through a chain of seven, 1.22x
    measured). But every bucket also costs each target a fixed amount of work besides its
    bytes (a header to each child, a slot, a checksum call, a thread hand-off on each
    side: about 1 ms of CPU per bucket and target on the development VM), so the size
    depends on what a bucket's hop costs:

    * ``network`` (some target is on another node than the source, or links are
      emulated) without ``delta``: a hop is the bucket's wire time, so buckets are
      small, the largest power of two at most ``total / 32``, at least 512 KiB. A 10 MB
      model through a chain of three nodes on 1 Gbit/s cables took 0.120 s in five 2 MiB
      buckets, 0.091-0.092 s in 512 KiB ones and 0.094 s in 1 MiB ones (one copy's wire
      time: 0.079 s); in 256 KiB buckets the per-bucket work took over (0.172 s).
    * ``network`` with ``delta`` (the sync keeps a delta base, so after the first push
      most buckets travel as small deltas or not at all): a hop is mostly per-bucket work,
      not wire time, so buckets are few, at most ``total / 4``, at least 2 MiB. On the
      same three-node chain (lr 1e-5, 0.6 MB of deltas a step) a delta push took 0.070 s
      in five 2 MiB buckets and 0.064 s in three of 4 MiB, against 0.097-0.144 s over
      five runs in twenty of 512 KiB; the first, full push pays for it (0.107 s in 2 MiB
      buckets against 0.095-0.098 s), as does a target that fell behind.
    * ``shared`` without ``network`` (lending is on and every target is on the source's
      node, so each reads its buckets from the source's shared arena): there is no hop,
      only the source's preparing of a bucket overlapping the targets' copying of the one
      before, and the per-bucket work is multiplied by the targets, so buckets are larger
      still, at most ``total / 4``, at least 2 MiB. In the RL loop of ``p2p-bench rl``
      (a 20 MB fp32 model to four rollout workers on the two-core VM, three runs each,
      alternated) the weights took 44.7-45.1 ms a step in five buckets of 4 MiB against
      48.2-58.6 ms in ten of 2 MiB.
    * otherwise (every target on the source's node, relayed: lending is off): a hop is a copy in
      memory, so buckets are large, at most ``total / 16``, at least 2 MiB. A 20 MB
      model pushed to four targets on one node took 65-80 ms in 512 KiB buckets and
      37-40 ms in 2 MiB ones.

    Seven targets taking a 1 GB model's delta at 1 Gbit/s (CPU-bound on two cores) took
    2.18-2.40 s in 32 MiB buckets and 2.04-2.79 s in 16 MiB ones; with ``delta`` such a
    model goes in 32 MiB buckets, without it in 16 MiB ones.

    Example:
        >>> auto_bucket_bytes([Entry("w", (1 << 26,), "torch.bfloat16")]) == 8 << 20
        True
        >>> auto_bucket_bytes([Entry("w", (1000,), "torch.float32")]) == 2 << 20
        True
        >>> auto_bucket_bytes([Entry("w", (1 << 26,), "torch.bfloat16")], network=True) == 4 << 20
        True
        >>> auto_bucket_bytes([Entry("w", (1 << 26,), "torch.bfloat16")], shared=True) == 32 << 20
        True
        >>> w = [Entry("w", (5_000_000,), "torch.bfloat16")]  # 10 MB
        >>> auto_bucket_bytes(w, network=True) >> 10
        512
        >>> auto_bucket_bytes(w, network=True, delta=True) >> 10
        2048
    """
    total = sum(e.numel * _itemsize(dtype_of(e.dtype)) for e in entries)
    if network and not delta:
        size, count = MIN_RELAY_BUCKET_BYTES, RELAY_BUCKETS
    elif shared or network:
        size, count = MIN_AUTO_BUCKET_BYTES, FEW_BUCKETS
    else:
        size, count = MIN_AUTO_BUCKET_BYTES, AUTO_BUCKETS
    while size * 2 <= min(total // count, DEFAULT_BUCKET_BYTES):
        size *= 2
    return size


def check_bucket_bytes(value: object) -> int:
    """Return ``value`` if it is a valid bucket size, else raise naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"bucket_bytes: expected an int, got {type(value).__name__}")
    if value < 1024:
        raise ValueError(f"bucket_bytes: got {value}; allowed: at least 1024 bytes")
    return value


# -- the tensors of a state dict or module --------------------------------------------------


def named_tensors(obj: object, arg: str) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The tensors of a module (parameters and persistent buffers) or a state dict.

    Returns:
        ``(tensors, frozen)``: key -> detached tensor (sharing storage) in the object's own
        order, and the keys of parameters that do not require grad (a module only).

    Raises:
        TypeError: ``obj`` is neither an ``nn.Module`` nor a mapping of str to tensors.
    """
    frozen: set[str] = set()
    if isinstance(obj, torch.nn.Module):
        raw = obj.state_dict(keep_vars=True)
        for key, value in raw.items():
            if isinstance(value, torch.nn.Parameter) and not value.requires_grad:
                frozen.add(key)
    elif isinstance(obj, Mapping):
        raw = dict(obj)
    else:
        raise TypeError(
            f"{arg}: expected a torch.nn.Module or a dict of str to torch.Tensor, got"
            f" {type(obj).__name__}"
        )
    out: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise TypeError(f"{arg}: keys must be str, got {key!r} ({type(key).__name__})")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{arg}[{key!r}]: expected a torch.Tensor, got {type(value).__name__}")
        out[key] = value.detach()
    return out, frozen


def target_entries(tensors: Mapping[str, torch.Tensor], arg: str) -> tuple[list[Entry], list[str]]:
    """A target's entries in its key order; tied tensors (same storage and view) once.

    Returns:
        ``(entries, keys)``: the entries and, for each, the target's key.

    Raises:
        ValueError: A tensor is not contiguous (it is written in place as a flat view).
    """
    seen: dict[tuple[torch.device, int, torch.dtype, tuple[int, ...], tuple[int, ...]], str] = {}
    entries: list[Entry] = []
    keys: list[str] = []
    for key, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"{arg}[{key!r}]: the tensor is not contiguous; weight sync writes targets in"
                " place as flat views (call .contiguous() on the target's tensors first)"
            )
        ident = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if t.numel() and ident in seen:
            continue  # a tied tensor: the first key carries it
        seen[ident] = key
        entries.append(Entry(key, tuple(t.shape), str(t.dtype)))
        keys.append(key)
    return entries, keys


def flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of a tensor (contiguous targets) or a flattened copy (others)."""
    return t.reshape(-1)


def gather(bucket: Bucket, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy (casting) the bucket's segments of ``tensors`` into ``out`` (1-D, bucket dtype)."""
    for s in bucket.segments:
        src = flat(tensors[s.entry])[s.start : s.start + s.count]
        out[s.offset : s.offset + s.count].copy_(src)
    return out


def pieces(bucket: Bucket, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The bucket's segments as 1-D views into the target's own (contiguous) tensors, in order.

    A patch applies to them in place and a checksum reads them end to end
    (``p2p_compress.apply_delta`` / ``tensor_checksum`` take such a list), so a delta
    bucket is never gathered into a buffer and scattered back.
    """
    return [tensors[s.entry].view(-1)[s.start : s.start + s.count] for s in bucket.segments]


def scatter(bucket: Bucket, buf: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Write the bucket buffer ``buf`` into the target's own tensors, in place."""
    for s in bucket.segments:
        dst = tensors[s.entry].view(-1)[s.start : s.start + s.count]
        dst.copy_(buf[s.offset : s.offset + s.count])
