"""Peer-process tasks of the chunked-frame tests (see ``wire_tasks`` for the conventions)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from collective_tasks import PeerContext
from wire_tasks import KiB, close, collective, compressible, group, random_bytes, token_ids

from p2p_compress import make_synthetic_tensor


def odd_payloads() -> list[tuple[str, Any]]:
    """Tensors whose sizes fall on and around chunk boundaries (64 KiB chunks)."""
    c = 64 * KiB
    return [
        ("two_chunks_exactly", compressible(2 * c)),
        ("one_byte_short", compressible(2 * c - 1, torch.uint8)),
        ("one_byte_over", compressible(2 * c + 1, torch.uint8)),
        ("odd_tail", compressible(3 * c + 5, torch.uint8)),
        ("int16_odd", compressible(5 * c + 2, torch.int16)),
        ("complex128_odd", compressible(2 * c + 16 * 7, torch.complex128)),
        (
            "mixed_dict",
            {
                "ids": token_ids(3 * c + 8 * 3),
                "noise": random_bytes(2 * c + 1, 5),  # not_smaller, chunk by chunk
                "f32": make_synthetic_tensor("sparse_float32", 4 * c),
                "small": torch.arange(7),
                "empty": torch.zeros(0),
            },
        ),
        ("list_of_chunked", [compressible(3 * c + 1, torch.uint8), compressible(c // 2)]),
    ]


def t_send_all(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], payloads: list[Any], async_op: bool
) -> dict[str, Any]:
    g = group(ctx, tag, cluster)
    works = [g.send(p, async_op=async_op, timeout=120) for p in payloads]
    if async_op:
        for w in works:
            w.wait(timeout=120)
    assert g.recv(timeout=120) == "done"
    out = {"stats": g.stats()["send"], "pool": collective(ctx, tag, cluster).compression_stats()}
    close(tag)
    return out


def t_recv_all(ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int) -> dict[str, Any]:
    g = group(ctx, tag, cluster)
    got = [g.recv(timeout=120) for _ in range(n)]
    g.send("done", timeout=60)
    out = {
        "got": got,
        "stats": g.stats()["recv"],
        "pool": collective(ctx, tag, cluster).compression_stats(),
    }
    close(tag)
    return out


@contextlib.contextmanager
def garbled_chunk(
    nth: int, codec_id: int | None = None, nbytes: int | None = None
) -> Iterator[None]:
    """Within the block, the ``nth`` compressed chunk (1-based; 0: none) is garbled.

    Only chunks compressed with ``codec_id`` count (None: any codec); ``nbytes`` of its
    payload (None: all) are overwritten with 0xFF after compression. The payload is a
    pooled buffer, never the user's tensor.
    """
    from p2p_collective._compression import _chunks

    original = _chunks.compress_chunk
    seen = [0]

    def garble(codec: Any, chunk: Any) -> Any:
        out = original(codec, chunk)
        if out.codec_id and (codec_id is None or out.codec_id == codec_id):
            seen[0] += 1
            if seen[0] == nth and out.payload is not None:
                out.payload[:nbytes].fill_(0xFF)
        return out

    _chunks.compress_chunk = garble  # type: ignore[assignment]
    try:
        yield
    finally:
        _chunks.compress_chunk = original  # type: ignore[assignment]


def t_send_corrupt_chunk(ctx: PeerContext, tag: str, cluster: dict[str, Any]) -> str:
    """Send a chunked tensor whose second compressed chunk is garbled, then a good one."""
    g = group(ctx, tag, cluster)
    with garbled_chunk(2):
        g.send(token_ids(512 * KiB, seed=1), timeout=60)
    g.send(token_ids(512 * KiB, seed=2), timeout=60)  # the same direction, still usable
    reply = str(g.recv(timeout=60))
    close(tag)
    return reply


def t_recv_corrupt_chunk(ctx: PeerContext, tag: str, cluster: dict[str, Any]) -> list[str]:
    from p2p_collective import FramingError

    g = group(ctx, tag, cluster)
    out: list[str] = []
    try:
        g.recv(timeout=60)
        out.append("NO ERROR")
    except FramingError as exc:
        out.append(f"FramingError: {exc}")
        out.append(f"cause {type(exc.__cause__).__name__}")
    got = g.recv(timeout=60)
    out.append(f"next ok={bool(torch.equal(got, token_ids(512 * KiB, seed=2)))}")
    out.append(f"broken={g.stats()['recv']['broken']}")
    pool = collective(ctx, tag, cluster).compression_stats()
    assert pool is not None
    out.append(f"pool active_bytes={pool['pool']['active_bytes']}")
    g.send("thanks", timeout=60)
    close(tag)
    return out


def id_bytes(n: int, seed: int) -> torch.Tensor:
    """Token ids' bytes as uint8: nothing to byte-shuffle, so lz4 keeps its 2x to zstd's 4x."""
    return token_ids(n, seed=seed).view(torch.uint8)


def _lz4_rate(adaptive: dict[str, Any]) -> float:
    """An emulated rate (Mbit/s) where lz4 is the fastest: the wire keeps pace with lz4.

    At ``link = lz4's rate / lz4's ratio`` lz4's compressed stream just fills the link,
    so lz4 beats raw by its ratio and beats zstd when zstd compresses slower than lz4.
    """
    data = adaptive["dtype"]  # uint8 and the class of its sample
    lz4 = adaptive["codecs"]["lz4"][data]
    zstd = adaptive["codecs"]["zstd"][data]
    assert lz4["mbps"] > 1.5 * zstd["mbps"], adaptive  # lz4 is the faster codec
    return float(lz4["mbps"] / lz4["ratio"])


def t_send_adaptive(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int, phases: list[str]
) -> list[Any]:
    """Send ``n`` frames per phase while the emulated link's rate changes between them.

    A phase is ``slow`` (20 Mbit/s), ``fast`` (100 Gbit/s) or ``lz4`` (the rate at which
    lz4 is the fastest, from the link's own figures so far).
    """
    g = group(ctx, tag, cluster)
    pacer = g._pacer
    assert pacer is not None
    out: list[Any] = []
    for i, phase in enumerate(phases):
        if phase == "lz4":
            mbps = _lz4_rate(g.stats()["send"]["adaptive"])
        else:
            mbps = {"slow": 20.0, "fast": 100_000.0}[phase]
        pacer.set_bandwidth(mbps)
        for k in range(n):
            g.send(id_bytes(512 * KiB, seed=10 * i + k), timeout=60)
        st = g.stats()["send"]
        out.append(
            {"mbps": mbps, "adaptive": st["adaptive"], "raw_reasons": dict(st["raw_reasons"])}
        )
    assert g.recv(timeout=60) == "done"
    close(tag)
    return out


def t_recv_adaptive(ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int, m: int) -> bool:
    g = group(ctx, tag, cluster)
    ok = True
    for i in range(m):
        for k in range(n):
            ok = ok and bool(torch.equal(g.recv(timeout=60), id_bytes(512 * KiB, seed=10 * i + k)))
    g.send("done", timeout=60)
    close(tag)
    return ok


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bytes (``torch.equal`` takes -0.0 for 0.0; the wire must not)."""
    return t.reshape(-1).view(torch.uint8)


def sparse_f32(nbytes: int, seed: int) -> torch.Tensor:
    """90%-zero float32 with -0.0 among the zeros (the benchmark's sparse data)."""
    return make_synthetic_tensor("sparse_float32", nbytes, seed=seed)


def t_send_sparse(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int, corrupt: int = 0
) -> dict[str, Any]:
    """Send ``n`` sparse float32 tensors (512 KiB), then a random one; stats before it.

    ``corrupt``: the index of the sparse-compressed chunk (1-based) to garble, 0: none.
    """
    g = group(ctx, tag, cluster)
    with garbled_chunk(corrupt, codec_id=3, nbytes=4):  # sparse's magic
        for k in range(n):
            g.send(sparse_f32(512 * KiB, seed=k), timeout=60)
    st = g.stats()["send"]
    g.send(make_synthetic_tensor("random_float32", 512 * KiB, seed=99), timeout=60)
    reply = g.recv(timeout=60)
    close(tag)
    return {"reply": reply, "stats": st}


def t_recv_sparse(ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int) -> list[str]:
    """Receive what :func:`t_send_sparse` sends; one line per frame (ok, or the error)."""
    from p2p_collective import FramingError

    g = group(ctx, tag, cluster)
    out: list[str] = []
    for k in range(n):
        try:
            got = g.recv(timeout=60)
            out.append(f"ok={bool(torch.equal(bits(got), bits(sparse_f32(512 * KiB, seed=k))))}")
        except FramingError as exc:
            out.append(f"FramingError: {exc} (cause {type(exc.__cause__).__name__})")
    last = g.recv(timeout=60)
    want = make_synthetic_tensor("random_float32", 512 * KiB, seed=99)
    out.append(f"random ok={bool(torch.equal(bits(last), bits(want)))}")
    out.append(f"broken={g.stats()['recv']['broken']}")
    pool = collective(ctx, tag, cluster).compression_stats()
    assert pool is not None
    out.append(f"pool active_bytes={pool['pool']['active_bytes']}")
    g.send("thanks", timeout=60)
    close(tag)
    return out
