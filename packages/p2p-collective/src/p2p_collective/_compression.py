"""Tensor compression on the wire (seed 000, "Tensor 压缩"): sender, receiver, shared state.

Scope: the CPU tensors of a generic ``send`` frame (a tensor, a list/tuple, an all-tensor
dict, a dataclass's tensor fields) that travel as payload messages of their own. A frame
small enough to ride inline in the header message is never compressed: the inline
rule is decided first, on raw sizes (with compression configured a frame is inline up
to :data:`~p2p_collective._framing.COMPRESSIBLE_INLINE_MAX`, 64 KiB), and a frame that
is inline costs one message already. Pickled objects, ``send_tensor`` / ``recv_tensor`` and
accelerator tensors are never compressed.

Per :class:`~p2p_collective.Collective` (one per process): one
:class:`~p2p_compress.TensorBufferPool`, created empty with the Collective, and one
:class:`~p2p_compress.TensorCodecProvider`, created at the first eligible tensor; both
shared by every group, with one compressor thread and one decoder thread (started on
first need) that let codec work overlap the wire:

* sender: a synchronous ``send`` compresses in the calling thread; an asynchronous one
  hands its frame to the compressor thread and returns at once, so the frames queued
  behind the one on the wire are compressed while it is sent. The direction thread takes
  a job over itself when the compressor has not started it yet, so it never waits on
  another group's work. Each compressed payload's buffer lease is returned to the pool
  as soon as that payload's send completed.
* receiver: a compressed payload is received into a pooled buffer of exactly its
  validated wire size; the decoder thread decompresses it straight into the allocated
  target (acquiring the codec only then, releasing it at once) while the direction
  thread already receives the frame's next payload.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from p2p_collective._emulation import LinkPacer
from p2p_collective._errors import CollectiveError
from p2p_collective._framing import (
    FIXED,
    FRAME_VERSION,
    TensorMeta,
    entry_size,
    patch_entry_codec,
    patch_wire_total,
)
from p2p_collective._jobs import Job, Worker
from p2p_collective._payload import OutFrame
from p2p_collective._transport import StoreLike
from p2p_compress import (
    CODEC_RAW,
    CompressionPlan,
    TensorBufferPool,
    TensorBufferPoolConfig,
    TensorCodecProvider,
    TensorCompressionConfig,
    plan_compression,
)

OVERLAP = True
"""Codec work overlaps the wire (compressor and decoder threads); benchmarks turn it off."""
COMPRESSOR_THREADS = 1
"""Compressor threads per Collective (bounded by CPUs and zstd's max_inflight too).

One keeps a stream's next frames compressed while one is on the wire, which is all a
link slow enough for compression to pay needs; every sending direction thread also
compresses its own frame when the compressor has not started it, so groups sending at
once compress in parallel. Measured on a busy 2-core machine, a second thread only took
CPU from the receiving process."""


# -- per-process state ---------------------------------------------------------------------


class WireCodec:
    """Compression state of one Collective: config, buffer pool, lazy codec provider, threads.

    Args:
        config: The job's ``tensor_compression`` section.
        pool: The job's ``tensor_buffer_pool`` section.
    """

    def __init__(self, config: TensorCompressionConfig, pool: TensorBufferPoolConfig) -> None:
        self.config = config
        self.pool = TensorBufferPool.from_config(pool)
        self._provider: TensorCodecProvider | None = None
        self._lock = threading.Lock()
        # zstd contexts beyond max_inflight would only make compressors go raw
        inflight = getattr(config.codec, "max_inflight", COMPRESSOR_THREADS)
        cpus = os.cpu_count() or 1
        self.compressor = Worker("p2p-compress", min(COMPRESSOR_THREADS, cpus, inflight))
        self.decoder = Worker("p2p-decompress")

    def provider(self) -> TensorCodecProvider:
        """The codec provider, created at the first call (the first eligible tensor)."""
        provider = self._provider
        if provider is None:
            with self._lock:
                if self._provider is None:
                    self._provider = TensorCodecProvider(self.config)
                provider = self._provider
        return provider

    def stats(self) -> dict[str, Any]:
        """``pool`` (buffer pool counters) and ``codec`` (provider counters, None until used)."""
        provider = self._provider
        return {
            "codec": None if provider is None else provider.stats(),
            "pool": self.pool.stats(),
        }

    def close(self) -> None:
        """Stop the worker threads (queued jobs are run by whoever needs them)."""
        self.compressor.close()
        self.decoder.close()


# -- configuration fingerprint -------------------------------------------------------------


def wire_fingerprint(config: TensorCompressionConfig | None) -> str:
    """The canonical JSON of what both ends of a group must share.

    The frame version (it also stands for the message protocol: header and payload tags)
    and the compression section. Buffer pool size, timeouts and link emulation are local
    to each process (emulation is paced by each sender on its own) and are not part of it.
    """
    section: dict[str, Any] | None = None
    if config is not None:
        section = config.to_dict()
        section["excluded_dtypes"] = sorted(section["excluded_dtypes"])
    return json.dumps(
        {"frame_version": FRAME_VERSION, "tensor_compression": section},
        sort_keys=True,
        separators=(",", ":"),
    )


def _frame_version(fingerprint: str | None) -> object:
    try:
        return json.loads(fingerprint or "null").get("frame_version")
    except (ValueError, AttributeError):
        return None


def publish_wire_config(store: StoreLike, prefix: str, role: str, fingerprint: str) -> None:
    """Publish this side's fingerprint under the direction's prefix (before announcing)."""
    try:
        store.set(f"{prefix}/{role}/wire", fingerprint.encode())
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc


def check_peer_wire_config(
    store: StoreLike, prefix: str, peer_role: str, fingerprint: str, me: str, peer: str
) -> None:
    """Compare the peer's published fingerprint (after meeting it) with ours.

    Raises:
        CollectiveError: The peer holds a different compression config (both are named)
            or published none.
    """
    key = f"{prefix}/{peer_role}/wire"
    try:
        theirs = bytes(store.get(key)).decode() if store.check([key]) else None
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {key!r}: {exc}") from exc
    if theirs == fingerprint:
        return
    mine_v, theirs_v = _frame_version(fingerprint), _frame_version(theirs)
    if mine_v != theirs_v:
        raise CollectiveError(
            f"{me!r} and its peer {peer!r} speak different p2p-collective wire protocols:"
            f" frame version {mine_v} here, {theirs_v or 'older than 4'} at {peer!r}; every"
            " process of a job must run the same p2p-collective version"
        )
    raise CollectiveError(
        f"{me!r} and its peer {peer!r} hold different job-level wire configurations: "
        f"{me!r} has {fingerprint}, {peer!r} has "
        f"{theirs if theirs is not None else 'none (an older p2p-collective?)'}; every "
        "process of a job must be given the same cluster.collective.tensor_compression"
    )


# -- statistics ----------------------------------------------------------------------------


@dataclass
class WireStats:
    """Tensor counters of one direction (the tensors of generic send/recv frames with bytes)."""

    compressed_tensors: int = 0
    raw_tensors: int = 0
    raw_reasons: dict[str, int] = field(default_factory=dict)
    tensor_raw_bytes: int = 0
    tensor_wire_bytes: int = 0
    codec_seconds: float = 0.0
    emulated_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(
        self,
        metas: list[TensorMeta],
        reasons: list[str] | str | None,
        codec_seconds: float = 0.0,
        emulated_seconds: float = 0.0,
    ) -> None:
        """Count a frame's tensors (those with bytes) and the time spent on them.

        Args:
            metas: The frame's tensor entries, as they went on the wire.
            reasons: Sender only: per tensor with bytes, "" when compressed or why it
                stayed raw; or one reason for all of them.
            codec_seconds: Time spent compressing or decoding them.
            emulated_seconds: Time the link emulation paced them.
        """
        n = comp = raw_bytes = wire_bytes = 0
        for m in metas:
            if m.raw_bytes:
                n += 1
                raw_bytes += m.raw_bytes
                wire_bytes += m.wire_bytes
                if m.codec_id != CODEC_RAW:
                    comp += 1
        with self.lock:
            self.codec_seconds += codec_seconds
            self.emulated_seconds += emulated_seconds
            self.tensor_raw_bytes += raw_bytes
            self.tensor_wire_bytes += wire_bytes
            self.compressed_tensors += comp
            self.raw_tensors += n - comp
            counts = self.raw_reasons
            if type(reasons) is list:
                for r in reasons:
                    if r:
                        counts[r] = counts.get(r, 0) + 1
            elif reasons and n > comp:
                assert isinstance(reasons, str)
                counts[reasons] = counts.get(reasons, 0) + n - comp

    def add_seconds(self, codec: float = 0.0, emulated: float = 0.0) -> None:
        """Add codec or pacing time spent outside a counted frame."""
        with self.lock:
            self.codec_seconds += codec
            self.emulated_seconds += emulated

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "compressed_tensors": self.compressed_tensors,
                "raw_tensors": self.raw_tensors,
                "raw_reasons": dict(self.raw_reasons),
                "tensor_raw_bytes": self.tensor_raw_bytes,
                "tensor_wire_bytes": self.tensor_wire_bytes,
                "codec_seconds": self.codec_seconds,
                "emulated_seconds": self.emulated_seconds,
            }


# -- sender --------------------------------------------------------------------------------


class Packed:
    """A frame after the compression decision: what the direction thread puts on the wire.

    Attributes:
        frame: The frame, its metadata patched for the compressed tensors.
        plan: The compression plan holding the buffer leases, or None when all are raw.
        reasons: Per tensor with bytes, "" when compressed or why it stayed raw; or one
            reason for all of them.
        ready: ``time.monotonic()`` at which the frame was ready to go (0: unknown).
        codec_seconds: Time spent compressing.
    """

    __slots__ = ("__weakref__", "codec_seconds", "frame", "plan", "ready", "reasons")

    def __init__(
        self,
        frame: OutFrame,
        plan: CompressionPlan | None,
        reasons: list[str] | str,
        ready: float,
        codec_seconds: float = 0.0,
    ) -> None:
        self.frame = frame
        self.plan = plan
        self.reasons = reasons
        self.ready = ready
        self.codec_seconds = codec_seconds


def compress_frame(codec: WireCodec, frame: OutFrame) -> Packed:
    """Decide per payload tensor, compress the ones that shrink, patch the frame's metadata.

    Raises:
        CompressionError: A codec failed (the leases taken are returned first).
    """
    cfg = codec.config
    with_bytes = [(i, m) for i, m in enumerate(frame.metas) if m.raw_bytes]
    # Cheap pre-check, so a frame without candidates never creates the provider.
    eligible = any(
        m.raw_bytes >= cfg.min_bytes and m.dtype not in cfg.excluded_dtypes for _, m in with_bytes
    )
    if not eligible:
        reasons = [
            "below_min_bytes" if m.raw_bytes < cfg.min_bytes else "excluded_dtype"
            for _, m in with_bytes
        ]
        return Packed(frame, None, reasons, time.monotonic())
    sources = [p.view(m.dtype) for p, (_, m) in zip(frame.payloads, with_bytes, strict=True)]
    t0 = time.perf_counter()
    plan = plan_compression(sources, cfg, codec.provider(), codec.pool)
    spent = time.perf_counter() - t0
    entries = plan.entries
    reasons = [e.reason for e in entries]
    if not any(e.compressed for e in entries):
        return Packed(frame, None, reasons, time.monotonic(), spent)
    metas = list(frame.metas)
    payloads = list(frame.payloads)
    view = frame.view
    offsets = []
    off = FIXED.size
    for m in frame.metas:
        offsets.append(off)
        off += entry_size(len(m.shape))
    for j, ((i, m), e) in enumerate(zip(with_bytes, entries, strict=True)):
        if e.compressed:
            metas[i] = m._replace(codec_id=e.codec_id, wire_bytes=e.wire_bytes)
            patch_entry_codec(view, offsets[i], e.codec_id, e.wire_bytes)
            payloads[j] = e.payload
    patch_wire_total(view, sum(m.wire_bytes for m in metas))
    packed = Packed(replace(frame, metas=metas, payloads=payloads), plan, reasons, 0.0, spent)
    # A frame dropped unsent (its direction broke or closed) gives its buffers back.
    weakref.finalize(packed, plan.release_all)
    packed.ready = time.monotonic()
    return packed


class Outgoing:
    """One queued send: its frame, compressed now or by the compressor thread."""

    __slots__ = ("_job", "_packed", "submitted")

    def __init__(self, packed: Packed | None, job: Job[Packed] | None) -> None:
        self._packed = packed
        self._job = job
        self.submitted = time.monotonic()

    @classmethod
    def prepare(cls, codec: WireCodec | None, frame: OutFrame, async_op: bool) -> Outgoing:
        """Compress ``frame`` now (synchronous send), later (asynchronous) or not at all.

        Raises:
            CompressionError: A codec failed (synchronous sends only).
        """
        if codec is None or not frame.payloads:
            # Without payload messages the tensors (if any) ride inline in the header.
            return cls(Packed(frame, None, "disabled" if codec is None else "inline", 0.0), None)
        if not async_op:
            return cls(compress_frame(codec, frame), None)
        job: Job[Packed] = Job(lambda: compress_frame(codec, frame))
        if OVERLAP:
            codec.compressor.put(job)
        # else the direction thread compresses it right before sending it
        return cls(None, job)

    def resolve(self, deadline: float | None) -> Packed:
        """The packed frame (compressing it here if the compressor has not started it).

        Raises:
            CompressionError: A codec failed.
            CollectiveTimeoutError: The compressor did not finish before ``deadline``.
        """
        packed = self._packed
        if packed is None:
            assert self._job is not None
            packed = self._packed = self._job.result(deadline)
            self._job = None
        if not packed.ready:
            packed.ready = self.submitted
        return packed


def transmit(
    send: Callable[[torch.Tensor, float | None, bool], None],
    packed: Packed,
    pacer: LinkPacer | None,
    stats: WireStats,
    deadline: float | None,
) -> int:
    """Put a packed frame on the wire, message by message; return the message count.

    On an emulated link the frame is scheduled first by its real wire size (the sender
    waits for its turn; the header then tells the receiver when the frame arrives); each
    compressed payload's buffer goes back to the pool once its send completed. On a
    failure the buffers not yet sent are discarded, not cached: the transport may still
    hold them.
    """
    frame, plan = packed.frame, packed.plan
    headers = frame.header_messages()
    payloads = frame.payloads
    if plan is None and pacer is None:  # the plain path: nothing to pace or give back
        for k, msg in enumerate(headers):
            send(msg, deadline, k == 0)  # the frame's first message travels as a header
        for msg in payloads:
            send(msg, deadline, False)
        stats.count(frame.metas, packed.reasons, packed.codec_seconds)
        return len(headers) + len(payloads)
    paced = 0.0
    try:
        if pacer is not None:
            sizes = [int(m.numel()) for m in headers] + [int(m.numel()) for m in payloads]
            paced = pacer.release(sizes, packed.ready, deadline, frame.view)
        for k, msg in enumerate(headers):
            send(msg, deadline, k == 0)
        for j, msg in enumerate(payloads):
            send(msg, deadline, False)
            if plan is not None:
                plan.release_entry(j)  # this payload's send completed
    except BaseException:
        if plan is not None:
            for entry in plan.entries:
                if entry.lease is not None:
                    entry.lease.discard()
        stats.add_seconds(codec=packed.codec_seconds, emulated=paced)
        raise
    stats.count(frame.metas, packed.reasons, packed.codec_seconds, paced)
    return len(headers) + len(payloads)
