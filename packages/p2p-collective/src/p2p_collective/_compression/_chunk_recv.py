"""Chunked frames, receiving side: each chunk checked, received, and decoded while the next arrives.

Every chunk descriptor is validated before its data is posted (the data message is
never longer than the chunk's raw size, and never longer than the receive posted for
it). A raw chunk is received straight into its place in the target tensor; a compressed
one into a pooled buffer of exactly its wire size (a plain allocation when the budget is
spent), then decoded into its place on a decoder thread while the direction thread
receives the next chunk (a chunk whose descriptor says it was byte-shuffled is
decoded into a pooled scratch buffer, then unshuffled into its place). A chunk that does
not decode is reported once the whole frame is off the wire, so the direction stays in
step and usable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from p2p_collective._compression._chunks import CHUNK_MAGIC, DESCRIPTOR, SHUFFLED
from p2p_collective._compression._decode import codec_name, decodes
from p2p_collective._compression._decode_rates import FrameDecodes
from p2p_collective._compression._jobs import Job
from p2p_collective._compression._state import CODEC_IDS, WireCodec
from p2p_collective._compression._stats import WireStats
from p2p_collective._errors import CleanFailure, CollectiveTimeoutError, FramingError
from p2p_collective._frames._framing import TensorMeta
from p2p_collective._frames._payload import flat_bytes
from p2p_collective._links._emulation import ArrivalGate
from p2p_collective._links._transport import remaining
from p2p_compress import (
    CompressionError,
    CompressionTimeoutError,
    decompress_into_tensor,
    unshuffle_bytes,
)
from p2p_compress.internal import CODEC_RAW, SHUFFLE_ITEMSIZES, BufferLease


class _Decode:
    __slots__ = ("chunk", "codec_id", "job", "lease", "raw", "shuffled", "tensor")

    def __init__(
        self,
        tensor: int,
        chunk: int,
        job: Job[float],
        lease: BufferLease | None,
        codec_id: int = CODEC_RAW,
        raw: int = 0,
        shuffled: bool = False,
    ):
        self.tensor = tensor
        self.chunk = chunk
        self.job = job
        self.lease = lease
        self.codec_id = codec_id
        self.raw = raw
        self.shuffled = shuffled


def _descriptor(
    view: memoryview, codec: WireCodec | None, peer: str, where: str, left: int, itemsize: int
) -> tuple[int, int, int, int, int, int]:
    """A validated descriptor: codec id, raw and wire bytes, arrival, hold, shuffle size."""
    magic, code, raw_len, wire_len, arrive_ns, hold_us = DESCRIPTOR.unpack_from(view, 0)
    if magic != CHUNK_MAGIC:
        raise FramingError(
            f"frame from {peer!r}: expected the descriptor of {where} but got bytes starting"
            f" {bytes(view[:8]).hex()}"
        )
    codec_id = code & ~SHUFFLED
    shuffle = itemsize if code & SHUFFLED else 0
    if code & SHUFFLED and (codec_id == CODEC_RAW or itemsize not in SHUFFLE_ITEMSIZES):
        raise FramingError(
            f"frame from {peer!r}: {where} says it is shuffled, but it is"
            f" {codec_name(codec_id)} of {itemsize}-byte elements (shuffles are of compressed"
            f" chunks of {', '.join(map(str, SHUFFLE_ITEMSIZES))}-byte elements)"
        )
    if not 0 < raw_len <= left:
        raise FramingError(
            f"frame from {peer!r}: {where} announces {raw_len} raw bytes, {left} remain"
        )
    if codec_id == CODEC_RAW:
        if wire_len != raw_len:
            raise FramingError(
                f"frame from {peer!r}: raw {where} has {wire_len} wire bytes for {raw_len}"
            )
    elif codec is None or codec_id not in CODEC_IDS.values():
        raise FramingError(
            f"frame from {peer!r}: {where} is compressed with {codec_name(codec_id)} but"
            f" this side {decodes(codec)}"
        )
    elif not 0 < wire_len < raw_len:
        raise FramingError(
            f"frame from {peer!r}: compressed {where} has {wire_len} wire bytes for"
            f" {raw_len} raw bytes"
        )
    return codec_id, raw_len, wire_len, arrive_ns, hold_us, shuffle


def receive_chunks(
    recv: Callable[[torch.Tensor, float | None], None],
    metas: list[TensorMeta],
    tensors: list[torch.Tensor],
    codec: WireCodec | None,
    stats: WireStats | None,
    peer: str,
    deadline: float | None,
    gate: ArrivalGate | None,
    seq: int = 0,
) -> tuple[list[TensorMeta], int, int]:
    """Receive every tensor's chunks into ``tensors`` (allocated from ``metas``).

    Each compressed chunk's decode call is timed; the sums per codec go back to the
    sender through ``stats`` (:meth:`WireStats.report_decodes`, frame ``seq``).

    Args:
        recv: Receives one payload message into the flat uint8 tensor it is given.
        metas: The frame's validated entries (raw, as a chunked frame writes them).
        tensors: The allocated targets, one per entry.
        codec: The Collective's compression state (None: compression off).
        stats: The direction's counters (chunks and decode time are added here).
        peer: The sender, for messages.
        deadline: ``time.monotonic()`` deadline, or None.
        gate: Holds each chunk until its emulated arrival (descriptors say when).
        seq: The frame's sequence number (for the decode report).

    Returns:
        The entries as they travelled (codec and wire bytes summed over chunks), the
        number of messages and of wire bytes received.

    Raises:
        FramingError: A descriptor is invalid (the direction breaks: out of step).
        CleanFailure: A chunk did not decode (a ``FramingError`` naming it; the whole
            frame was received, so the direction stays usable).
        CollectiveTimeoutError, PeerError: From the link, or no decoder in time.
    """
    desc = torch.empty(DESCRIPTOR.size, dtype=torch.uint8)
    view = desc.numpy().data
    pending: list[_Decode] = []
    out = list(metas)
    messages = wire = chunks = compressed = 0
    held = 0.0
    try:
        for i, (t, m) in enumerate(zip(tensors, metas, strict=True)):
            target = flat_bytes(t) if m.raw_bytes else t
            off = k = tensor_wire = 0
            codec_used = CODEC_RAW
            while off < m.raw_bytes:
                where = f"chunk {k} of tensor {i}"
                recv(desc, deadline)
                received_at = time.monotonic()
                codec_id, raw_len, wire_len, arrive_ns, hold_us, shuffle = _descriptor(
                    view, codec, peer, where, m.raw_bytes - off, m.dtype.itemsize
                )
                dst = target[off : off + raw_len]
                if codec_id == CODEC_RAW:
                    recv(dst, deadline)
                else:
                    assert codec is not None  # _descriptor refuses it otherwise
                    lease = codec.pool.acquire(wire_len)
                    if lease is None:  # the bytes are on their way: take them anyway
                        src = torch.empty(wire_len, dtype=torch.uint8)
                    else:
                        src = lease.buffer[:wire_len]
                    try:
                        recv(src, deadline)
                    except BaseException:
                        if lease is not None:
                            lease.discard()  # the transport may still write into it
                        raise
                    job = _decode_job(codec, codec_id, src, dst, lease, deadline, shuffle)
                    pending.append(_Decode(i, k, job, lease, codec_id, raw_len, bool(shuffle)))
                    if codec.pipeline.overlap:
                        codec.decoder.put(job)
                    codec_used = codec_id
                    compressed += 1
                if gate is not None and arrive_ns:
                    arrival = gate.arrival(arrive_ns, hold_us, received_at)
                    if arrival is not None:
                        held += gate.wait(arrival, deadline)
                off += raw_len
                tensor_wire += wire_len
                wire += DESCRIPTOR.size + wire_len
                messages += 2
                chunks += 1
                k += 1
            if m.raw_bytes:
                out[i] = m._replace(codec_id=codec_used, wire_bytes=tensor_wire)
        failure = _finish(pending, deadline, stats, peer, seq)
    except BaseException:
        for p in pending:
            if p.job.cancel() and p.lease is not None:
                p.lease.release()
        raise
    if stats is not None:
        stats.add_seconds(emulated=held)
        stats.count_chunks(chunks, compressed, {})
    if failure is not None:
        raise CleanFailure(failure) from failure.__cause__
    return out, messages, wire


def _decode_job(
    codec: WireCodec,
    codec_id: int,
    src: torch.Tensor,
    dst: torch.Tensor,
    lease: BufferLease | None,
    deadline: float | None,
    shuffle: int = 0,
) -> Job[float]:
    provider = codec.provider(codec_id)

    def decode() -> float:
        t0 = time.perf_counter()
        try:
            if shuffle:
                _decode_shuffled(codec, codec_id, src, dst, shuffle, deadline)
            else:
                decompress_into_tensor(codec_id, src, dst, provider, timeout=remaining(deadline))
        finally:
            if lease is not None:
                lease.release()
        return time.perf_counter() - t0

    return Job(decode)


def _decode_shuffled(
    codec: WireCodec,
    codec_id: int,
    src: torch.Tensor,
    dst: torch.Tensor,
    itemsize: int,
    deadline: float | None,
) -> None:
    """Decode a shuffled chunk into a pooled scratch buffer, then unshuffle it into ``dst``."""
    n = int(dst.numel())
    scratch = codec.pool.acquire(n)
    planes = torch.empty(n, dtype=torch.uint8) if scratch is None else scratch.buffer[:n]
    try:
        provider = codec.provider(codec_id)
        decompress_into_tensor(codec_id, src, planes, provider, timeout=remaining(deadline))
        unshuffle_bytes(planes, dst, itemsize)
    finally:
        if scratch is not None:
            scratch.release()


def _finish(
    pending: list[_Decode],
    deadline: float | None,
    stats: WireStats | None,
    peer: str,
    seq: int,
) -> FramingError | None:
    """Wait for (or run) every decode; return the first corrupt chunk's error, if any."""
    failure: FramingError | None = None
    seconds = 0.0
    decodes = FrameDecodes()
    for p in pending:
        try:
            took = p.job.result(deadline)
            seconds += took
            decodes.add(p.codec_id, p.raw, took, p.shuffled)
        except CompressionTimeoutError as exc:
            raise CollectiveTimeoutError(
                f"no decoder became free for chunk {p.chunk} of tensor {p.tensor} from"
                f" {peer!r} before the deadline: {exc}"
            ) from exc
        except CompressionError as exc:
            if failure is None:
                failure = FramingError(
                    f"frame from {peer!r}: compressed chunk {p.chunk} of tensor {p.tensor}"
                    f" does not decode: {exc}"
                )
                failure.__cause__ = exc
    if stats is not None:
        stats.add_seconds(codec=seconds)
        if failure is None:
            stats.report_decodes(seq, decodes)
    return failure
