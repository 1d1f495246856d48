"""Peer-process tasks of the compression-on-the-wire and link-emulation tests.

Each task runs in one of the warm peer processes of ``conftest.PeerPair`` (see
``collective_tasks.serve``). Configurations differ per test, so every task builds (and
caches) a Collective of its own, named ``peer-a/<tag>`` or ``peer-b/<tag>``, from a
plain-dict config; the pair then talks over that Collective's groups.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from typing import Any

import torch
from collective_tasks import Batch, PeerContext

from p2p_collective import (
    Collective,
    CollectiveConfig,
    CollectiveGroup,
    parse_collective_config,
    parse_net_emulation,
)
from p2p_compress import make_synthetic_tensor

KiB = 1024
MiB = 1024 * KiB
_COLLECTIVES: dict[str, Collective] = {}


def config_from(cluster: dict[str, Any]) -> CollectiveConfig:
    """The CollectiveConfig of a ``cluster`` dict (``collective`` and ``net_emulation``)."""
    cfg = parse_collective_config(cluster.get("collective"), "cluster.collective")
    net = parse_net_emulation(cluster.get("net_emulation"), "cluster.net_emulation")
    return dataclasses.replace(cfg, net_emulation=net)


def collective(ctx: PeerContext, tag: str, cluster: dict[str, Any]) -> Collective:
    """This peer's Collective for ``tag`` (created at first use with ``cluster``)."""
    coll = _COLLECTIVES.get(tag)
    if coll is None:
        coll = Collective(f"{ctx.name}/{tag}", ctx.store, config=config_from(cluster), timeout=30)
        _COLLECTIVES[tag] = coll
    return coll


def group(ctx: PeerContext, tag: str, cluster: dict[str, Any]) -> CollectiveGroup:
    coll = collective(ctx, tag, cluster)
    return coll.create_collective_group([f"{ctx.name}/{tag}", f"{ctx.peer}/{tag}"])


def close(tag: str) -> None:
    coll = _COLLECTIVES.pop(tag, None)
    if coll is not None:
        coll.close()


def compressible(n: int, dtype: torch.dtype = torch.int64, seed: int = 0) -> torch.Tensor:
    """``n`` bytes of small values with long runs (every codec shrinks them)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 4, (max(n // 64, 1),), generator=g, dtype=torch.int64)
    flat = base.repeat_interleave(64)[:n].to(torch.uint8)
    if dtype == torch.bool:
        flat = flat & 1  # a bool byte must be 0 or 1
    return flat.view(dtype)


def token_ids(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` bytes of int64 token ids: lz4 shrinks them about 2x, zstd about 4x."""
    from p2p_compress import make_synthetic_tensor

    return make_synthetic_tensor("int64_token_ids", n, seed=seed)


def random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def wire_payloads() -> list[tuple[str, Any]]:
    """Every payload kind with tensors above ``min_bytes`` (deterministic)."""
    big = 96 * KiB
    dtypes = [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
        torch.complex128,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ]
    out: list[tuple[str, Any]] = [
        ("tensor", compressible(MiB, torch.int64).reshape(256, 512)),
        ("scalar_and_small", [torch.tensor(3.5), compressible(big), torch.ones(3)]),
        (
            "list",
            [compressible(big, torch.int32), random_bytes(big), torch.zeros(0), compressible(big)],
        ),
        ("tuple", (compressible(big, torch.int16), make_synthetic_tensor("bool_mask", big))),
        (
            "dict",
            {"ids": compressible(big, torch.int64), "mask": torch.ones(big, dtype=torch.bool)},
        ),
        ("dict_nonstr_keys", {7: compressible(big), (1, "x"): compressible(big, torch.int32)}),
        ("ordered_dict", OrderedDict([("b", compressible(big)), ("a", random_bytes(big, 3))])),
        ("dataclass", Batch(compressible(big, torch.int64), 5, torch.zeros(big, dtype=torch.bool))),
        ("sparse_float32", make_synthetic_tensor("sparse_float32", 256 * KiB)),
        ("random_float32", make_synthetic_tensor("random_float32", 256 * KiB)),
        ("requires_grad", compressible(big, torch.float64).clone().requires_grad_(True)),
        ("conj_view", torch.zeros(big // 8, dtype=torch.complex64).conj()),
        ("every_dtype", [compressible(big, dt) for dt in dtypes]),
        (
            "at_min_bytes",  # exactly min_bytes, 8 bytes less, and one to leave the inline path
            [compressible(16 * KiB), compressible(16 * KiB - 8), compressible(big)],
        ),
        ("object", {"not": "tensors", "blob": b"\0" * (200 * KiB)}),
        ("mixed_object", [torch.zeros(big, dtype=torch.uint8), "a string"]),
        ("inline_frame", [compressible(20 * KiB), compressible(20 * KiB)]),
    ]
    return out


def t_send_wire_payloads(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], async_op: bool
) -> dict[str, Any]:
    g = group(ctx, tag, cluster)
    works = [g.send(p, async_op=async_op, timeout=120) for _, p in wire_payloads()]
    if async_op:
        for w in works:
            w.wait(timeout=120)
    out = {"stats": g.stats()["send"], "pool": collective(ctx, tag, cluster).compression_stats()}
    close(tag)
    return out


def t_recv_wire_payloads(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], async_op: bool
) -> dict[str, Any]:
    g = group(ctx, tag, cluster)
    n = len(wire_payloads())
    if async_op:
        works = [g.recv(async_op=True, timeout=120) for _ in range(n)]
        got = [w.wait(timeout=120) for w in works]
    else:
        got = [g.recv(timeout=120) for _ in range(n)]
    out = {
        "got": got,
        "stats": g.stats()["recv"],
        "pool": collective(ctx, tag, cluster).compression_stats(),
    }
    close(tag)
    return out


def t_send_one(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], payload: Any, times: int = 1
) -> dict[str, Any]:
    g = group(ctx, tag, cluster)
    for _ in range(times):
        g.send(payload, timeout=120)
    assert g.recv(timeout=120) == "done"  # the receiver has everything
    out = {"stats": g.stats()["send"], "pool": collective(ctx, tag, cluster).compression_stats()}
    close(tag)
    return out


def t_recv_some(ctx: PeerContext, tag: str, cluster: dict[str, Any], times: int = 1) -> Any:
    g = group(ctx, tag, cluster)
    got = [g.recv(timeout=120) for _ in range(times)]
    g.send("done")
    out = {
        "got": got[0] if times == 1 else got,
        "stats": g.stats()["recv"],
        "pool": collective(ctx, tag, cluster).compression_stats(),
    }
    close(tag)
    return out


def t_send_while_codec_held(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int
) -> dict[str, Any]:
    """Hold every zstd context, send ``n`` async messages (raw, at once), then ``n`` more."""
    coll = collective(ctx, tag, cluster)
    g = group(ctx, tag, cluster)
    wire = coll._wire
    assert wire is not None
    provider = wire.provider()
    held = [provider.acquire_encoder() for _ in range(provider.max_inflight or 1)]
    assert all(c is not None for c in held)
    t0 = time.monotonic()
    works = [g.send(compressible(256 * KiB, seed=i), async_op=True, timeout=60) for i in range(n)]
    for w in works:
        w.wait(timeout=60)  # would deadlock if a sender waited for a codec
    held_seconds = time.monotonic() - t0
    busy = dict(g.stats()["send"]["raw_reasons"])
    for c in held:
        assert c is not None
        provider.release(c)
    for i in range(n):
        g.send(compressible(256 * KiB, seed=n + i), async_op=True, timeout=60)
    assert g.recv(timeout=60) == "done"
    out = {
        "busy_while_held": busy,
        "held_seconds": held_seconds,
        "stats": g.stats()["send"],
        "codec": coll.compression_stats()["codec"],
    }
    close(tag)
    return out


def t_fan_out_async(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], spokes: int, per: int
) -> Any:
    """One Collective (one provider) sending to ``spokes`` peers at once, all async."""
    hub = Collective(f"hub/{tag}", ctx.store, config=config_from(cluster), timeout=60)
    groups = [hub.create_collective_group([f"hub/{tag}", f"spoke{i}/{tag}"]) for i in range(spokes)]
    works = [
        g.send(compressible(512 * KiB, seed=100 * i + r), async_op=True, timeout=120)
        for r in range(per)
        for i, g in enumerate(groups)
    ]
    for w in works:
        w.wait(timeout=120)
    for g in groups:
        assert g.recv(timeout=120) == "done"
    stats = [g.stats()["send"] for g in groups]
    codec = hub.compression_stats()
    hub.close()
    return {"stats": stats, "codec": codec}


def t_fan_in(ctx: PeerContext, tag: str, cluster: dict[str, Any], spokes: int, per: int) -> Any:
    colls = [
        Collective(f"spoke{i}/{tag}", ctx.store, config=config_from(cluster), timeout=60)
        for i in range(spokes)
    ]
    groups = [
        c.create_collective_group([f"spoke{i}/{tag}", f"hub/{tag}"]) for i, c in enumerate(colls)
    ]
    works = [[g.recv(async_op=True, timeout=120) for _ in range(per)] for g in groups]
    ok = True
    for i, ws in enumerate(works):
        for r, w in enumerate(ws):
            ok = ok and torch.equal(w.wait(timeout=120), compressible(512 * KiB, seed=100 * i + r))
    for g in groups:
        g.send("done")
    for c in colls:
        c.close()
    return ok


def t_first_op(ctx: PeerContext, tag: str, cluster: dict[str, Any], op: str) -> str:
    """Run one operation expected to fail at setup; return the error's type and message."""
    g = group(ctx, tag, cluster)
    try:
        if op == "send":
            g.send(torch.zeros(4), timeout=30)
        else:
            g.recv(timeout=30)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        close(tag)
    return "NO ERROR"


def t_send_corrupted(ctx: PeerContext, tag: str, cluster: dict[str, Any], index: int) -> str:
    """Send a list whose compressed tensor ``index`` is garbled after compression."""
    from p2p_collective._compression import _schedule

    g = group(ctx, tag, cluster)
    original = _schedule.compress_frame

    def corrupt(codec: Any, frame: Any, codec_id: int | None = None) -> Any:
        packed = original(codec, frame, codec_id)
        packed.frame.payloads[index].fill_(0xFF)  # a pooled buffer, not the user's tensor
        return packed

    _schedule.compress_frame = corrupt  # type: ignore[assignment]
    try:
        # about 2x in lz4: three of them stay payload messages (not inline)
        g.send([token_ids(256 * KiB, seed=i) for i in range(3)], timeout=60)
    finally:
        _schedule.compress_frame = original  # type: ignore[assignment]
    ctx.barrier(tag + "/corrupt")
    # a second group of the same two Collectives is unaffected
    other = collective(ctx, tag, cluster).create_collective_group(
        [f"{ctx.name}/{tag}", f"{ctx.peer}/{tag}"], group_name=tag + "/other"
    )
    other.send(compressible(256 * KiB, seed=9), timeout=60)
    back = g.recv(timeout=60)  # the peer's sending direction of the broken group still works
    close(tag)
    return str(back)


def t_recv_corrupted(ctx: PeerContext, tag: str, cluster: dict[str, Any]) -> list[str]:
    from p2p_collective import FramingError, GroupBrokenError

    g = group(ctx, tag, cluster)
    out: list[str] = []
    work = g.recv(async_op=True, timeout=60)
    err = work.exception(timeout=60)
    assert isinstance(err, FramingError), repr(err)
    out.append(f"{type(err).__name__}: {err}")
    out.append(f"cause {type(err.__cause__).__name__}")
    ctx.barrier(tag + "/corrupt")
    try:
        g.recv(timeout=10)
    except GroupBrokenError as exc:
        out.append(f"then GroupBrokenError cause={type(exc.__cause__).__name__}")
    other = collective(ctx, tag, cluster).create_collective_group(
        [f"{ctx.name}/{tag}", f"{ctx.peer}/{tag}"], group_name=tag + "/other"
    )
    ok = torch.equal(other.recv(timeout=60), compressible(256 * KiB, seed=9))
    out.append(f"other group ok={ok}")
    g.send("reply on the healthy direction", timeout=60)
    pool = collective(ctx, tag, cluster).compression_stats()["pool"]
    out.append(f"pool active_bytes={pool['active_bytes']}")
    close(tag)
    return out


# -- link emulation -----------------------------------------------------------------------


def t_timed_send(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], payloads: list[Any], async_op: bool
) -> dict[str, Any]:
    """Send ``payloads`` once both sides are connected; return the start time and stats."""
    g = group(ctx, tag, cluster)
    g.send("warm-up", timeout=60)  # connects the direction (and paces a tiny message)
    ctx.barrier(tag + "/go")
    before = g.stats()["send"]
    t0 = time.monotonic()
    works = [g.send(p, async_op=async_op, timeout=120) for p in payloads]
    for w in works:
        if async_op:
            w.wait(timeout=120)
    sent = time.monotonic() - t0
    after = g.stats()["send"]
    assert g.recv(timeout=60) == "done"
    close(tag)
    return {
        "t0": t0,
        "sender_seconds": sent,
        "wire_bytes": after["wire_bytes"] - before["wire_bytes"],
        "tensor_wire_bytes": after["tensor_wire_bytes"] - before["tensor_wire_bytes"],
        "emulated_seconds": after["emulated_seconds"] - before["emulated_seconds"],
    }


def t_timed_recv(ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int) -> dict[str, Any]:
    g = group(ctx, tag, cluster)
    assert g.recv(timeout=60) == "warm-up"
    before = g.stats()["recv"]
    works = [g.recv(async_op=True, timeout=120) for _ in range(n)]
    ctx.barrier(tag + "/go")
    got = [w.wait(timeout=120) for w in works]
    t1 = time.monotonic()
    held = g.stats()["recv"]["emulated_seconds"] - before["emulated_seconds"]
    g.send("done")
    close(tag)
    return {"t1": t1, "got": got, "emulated_seconds": held}


def t_send_then_wait(ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int) -> float:
    """Send ``n`` small objects at once; return how long the sends took."""
    g = group(ctx, tag, cluster)
    g.send("warm-up", timeout=60)
    ctx.barrier(tag + "/go")
    t0 = time.monotonic()
    for i in range(n):
        g.send(i, timeout=60)
    took = time.monotonic() - t0
    assert g.recv(timeout=60) == "done"
    close(tag)
    return took


def t_late_recv(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int, late: float
) -> dict[str, Any]:
    """Receive ``n`` objects only ``late`` seconds after the sender sent them."""
    g = group(ctx, tag, cluster)
    assert g.recv(timeout=60) == "warm-up"
    ctx.barrier(tag + "/go")
    time.sleep(late)
    t0 = time.monotonic()
    got = [g.recv(timeout=60) for _ in range(n)]
    took = time.monotonic() - t0
    g.send("done")
    close(tag)
    return {"got": got, "took": took}


def t_star_send(
    ctx: PeerContext, tag: str, cluster: dict[str, Any], payload: torch.Tensor, n: int
) -> float:
    """One sender sends ``payload`` to ``n`` receivers at once; return when it started."""
    hub = Collective(f"hub/{tag}", ctx.store, config=config_from(cluster), timeout=30)
    groups = [hub.create_collective_group([f"hub/{tag}", f"spoke{i}/{tag}"]) for i in range(n)]
    for g in groups:
        g.send("warm-up", timeout=60)
    ctx.barrier(tag + "/go")
    t0 = time.monotonic()
    works = [g.send(payload, async_op=True, timeout=120) for g in groups]
    for w in works:
        w.wait(timeout=120)
    for g in groups:
        assert g.recv(timeout=60) == "done"
    hub.close()
    return t0


def t_star_recv(ctx: PeerContext, tag: str, cluster: dict[str, Any], n: int) -> dict[str, Any]:
    """``n`` receivers (a Collective each) take one payload each; the last arrival time."""
    spokes = [
        Collective(f"spoke{i}/{tag}", ctx.store, config=config_from(cluster), timeout=30)
        for i in range(n)
    ]
    groups = [
        c.create_collective_group([f"spoke{i}/{tag}", f"hub/{tag}"]) for i, c in enumerate(spokes)
    ]
    for g in groups:
        assert g.recv(timeout=60) == "warm-up"
    works = [g.recv(async_op=True, timeout=120) for g in groups]
    ctx.barrier(tag + "/go")
    got = [w.wait(timeout=120) for w in works]
    t1 = time.monotonic()
    for g in groups:
        g.send("done")
    for c in spokes:
        c.close()
    return {"t1": t1, "got": got}
