"""Tasks for the shared-memory tests, run inside the warm peer processes (see conftest)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from collective_tasks import PeerContext

from p2p_collective import Collective, CollectiveGroup, FramingError, parse_collective_config

MIB = 1 << 20


@dataclasses.dataclass
class Big:
    weights: torch.Tensor
    step: int
    mask: torch.Tensor


def big_payloads() -> list[tuple[str, Any]]:
    """Payloads whose tensors are large enough for the segment (and some that are not)."""
    g = torch.Generator().manual_seed(11)
    return [
        ("f32", torch.randn(1 << 20, generator=g)),  # 4 MiB: one chunk
        ("odd_bytes", torch.randint(0, 255, (8 * MIB + 3,), dtype=torch.uint8, generator=g)),
        ("many_chunks", torch.randn(5, 1 << 20, dtype=torch.float64, generator=g)),  # 40 MiB
        ("at_threshold", torch.randint(0, 9, (256 << 10,), dtype=torch.uint8, generator=g)),
        (
            "under_threshold",
            torch.randint(0, 9, ((256 << 10) - 1,), dtype=torch.uint8, generator=g),
        ),
        ("bf16", torch.arange(1 << 19, dtype=torch.bfloat16)),
        ("bool", torch.rand(1 << 19, generator=g) > 0.5),
        ("complex", torch.randn(1 << 17, dtype=torch.complex64, generator=g)),
        ("int16", torch.arange(1 << 19, dtype=torch.int16)),
        ("list", [torch.arange(1 << 18), torch.ones(3), torch.full((1 << 18,), 7.0)]),
        ("tuple", (torch.zeros(1 << 18, dtype=torch.int32), torch.tensor(5))),
        ("dict", {"w": torch.randn(512, 512, generator=g), "b": torch.ones(512)}),
        ("ordered", OrderedDict([("z", torch.arange(1 << 17)), ("a", torch.ones(2))])),
        ("dataclass", Big(torch.randn(256, 1024, generator=g), 3, torch.ones(1 << 18) > 0)),
        ("object", {"blob": b"\x07" * 300_000, "step": 9}),
        ("small", {"loss": 0.5}),
    ]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            _equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    return bool(a == b)


def transports(g: CollectiveGroup) -> dict[str, tuple[Any, Any]]:
    st = g.stats()
    return {r: (st[r]["transport"], st[r]["transport_reason"]) for r in ("send", "recv")}


def t_exchange_payloads(ctx: PeerContext, gname: str) -> Any:
    """Both sides send every payload, then receive the peer's: exact values, transports."""
    g = ctx.group(gname)
    payloads = big_payloads()
    works = [g.send(p, async_op=True, timeout=120) for _, p in payloads]
    bad = [name for name, p in payloads if not _equal(p, g.recv(timeout=120))]
    for w in works:
        w.wait(timeout=120)
    out = transports(g)
    ctx.barrier(gname)
    return bad, out


def t_big_send(ctx: PeerContext, gname: str, nbytes: int) -> Any:
    g = ctx.group(gname)
    t = torch.arange(nbytes // 4, dtype=torch.int32)
    t0 = time.monotonic()
    g.send(t, timeout=300)
    elapsed = time.monotonic() - t0
    ctx.barrier(gname)
    return elapsed, transports(g)["send"]


def t_big_recv(ctx: PeerContext, gname: str, nbytes: int) -> Any:
    g = ctx.group(gname)
    got = g.recv(timeout=300)
    same = bool(torch.equal(got, torch.arange(nbytes // 4, dtype=torch.int32)))
    del got
    ctx.barrier(gname)
    return same, transports(g)["recv"]


def t_async_sends(ctx: PeerContext, gname: str, n: int) -> Any:
    g = ctx.group(gname)
    works = [
        g.send({"i": i, "t": torch.full((64 * 1024 * (1 + i % 7),), i)}, async_op=True)
        for i in range(n)
    ]
    for w in works:
        w.wait(timeout=120)
    ctx.barrier(gname)
    return transports(g)["send"]


def t_async_recvs(ctx: PeerContext, gname: str, n: int) -> Any:
    g = ctx.group(gname)
    works = [g.recv(async_op=True, timeout=120) for _ in range(n)]
    got = []
    for w in works:
        d = w.wait(timeout=120)
        assert torch.equal(d["t"], torch.full((64 * 1024 * (1 + d["i"] % 7),), d["i"]))
        got.append(d["i"])
    ctx.barrier(gname)
    return got, transports(g)["recv"]


@contextlib.contextmanager
def _collective(ctx: PeerContext, tag: str, section: dict[str, Any]) -> Iterator[Collective]:
    coll = Collective(f"{ctx.name}-{tag}", ctx.store, config=parse_collective_config(section))
    try:
        yield coll
    finally:
        coll.close()


def _pair(ctx: PeerContext, coll: Collective, tag: str) -> CollectiveGroup:
    group = coll.create_collective_group([f"{ctx.name}-{tag}", f"{ctx.peer}-{tag}"])
    assert isinstance(group, CollectiveGroup)
    return group


def t_compressed(ctx: PeerContext, tag: str) -> Any:
    """zstd on the wire: the compressed payloads (> 256 KiB) ride the segment."""
    section = {"tensor_compression": {"codec": "zstd"}}
    with _collective(ctx, tag, section) as coll:
        g = _pair(ctx, coll, tag)
        data = {
            "q": torch.randint(0, 4, (8 * MIB,), dtype=torch.uint8),  # ~2 MiB compressed
            "w": torch.arange(2 * MIB, dtype=torch.int64) % 1000,
        }
        if ctx.rank == 0:
            g.send(data, timeout=120)
            st = g.stats()["send"]
            out = (st["compressed_tensors"], st["tensor_wire_bytes"] < st["tensor_raw_bytes"])
            ok = True
        else:
            got = g.recv(timeout=120)
            ok = bool(got["w"].equal(data["w"]) and got["q"].shape == data["q"].shape)
            ok = ok and bool((got["q"] < 4).all())
            st = g.stats()["recv"]
            out = (st["compressed_tensors"], st["transport"])
        ctx.barrier(tag)
        return ok, out, transports(g)


def t_send_tensor(ctx: PeerContext, gname: str, nbytes: int) -> Any:
    g = ctx.group(gname)
    if ctx.rank == 0:
        g.send_tensor(torch.arange(nbytes // 8, dtype=torch.float64), timeout=60)
        result: Any = transports(g)["send"]
    else:
        buf = torch.empty(nbytes // 8, dtype=torch.float64)
        ptr = buf.data_ptr()
        back = g.recv_tensor(buf, timeout=60)
        result = (
            back is buf and buf.data_ptr() == ptr,
            bool(torch.equal(buf, torch.arange(nbytes // 8, dtype=torch.float64))),
            transports(g)["recv"],
        )
    ctx.barrier(gname)
    return result


def t_disabled(ctx: PeerContext, tag: str, mine: bool) -> Any:
    """shared_memory set to ``mine`` on this side; the data moves either way."""
    with _collective(ctx, tag, {"shared_memory": mine}) as coll:
        g = _pair(ctx, coll, tag)
        t = torch.arange(MIB, dtype=torch.int32)
        w = g.send(t, async_op=True, timeout=60)
        got = g.recv(timeout=60)
        w.wait(timeout=60)
        ctx.barrier(tag)
        return bool(torch.equal(got, t)), transports(g)


def t_other_host(ctx: PeerContext, tag: str) -> Any:
    """Rank 1 (the receiver of 0to1) claims another hostname: 0to1 falls back to gloo."""
    g = ctx.group(tag)
    real = socket.gethostname
    if ctx.rank == 1:
        socket.gethostname = lambda: "some-other-node"  # type: ignore[assignment]
    try:
        if ctx.rank == 0:
            g.send(torch.ones(MIB), timeout=60)
        else:
            assert torch.equal(g.recv(timeout=60), torch.ones(MIB))
    finally:
        socket.gethostname = real  # type: ignore[method-assign]
    ctx.barrier(tag)
    return transports(g)


def t_mismatch_send(ctx: PeerContext, gname: str, nbytes: int) -> str:
    g = ctx.group(gname)
    outcome = "ok"
    try:
        g.send_tensor(torch.zeros(nbytes, dtype=torch.uint8), timeout=30)
    except Exception as exc:
        outcome = type(exc).__name__
    ctx.barrier(gname)
    return outcome


def t_mismatch_recv(ctx: PeerContext, gname: str, nbytes: int) -> tuple[str, float]:
    g = ctx.group(gname)
    t0 = time.monotonic()
    try:
        if nbytes:
            g.recv_tensor(torch.empty(nbytes, dtype=torch.uint8), timeout=30)
        else:
            g.recv(timeout=30)
        outcome = "ok"
    except FramingError as exc:
        outcome = f"FramingError: {exc}"
    elapsed = time.monotonic() - t0
    ctx.barrier(gname)
    return outcome, elapsed


# -- peer death (dedicated processes) ------------------------------------------------------


def shm_fds() -> list[str]:
    """Descriptors of this process that are segments or mappings of segments."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if "p2p-shm" in target:
                out.append(target)
    with open("/proc/self/maps") as maps:
        out += [line.strip() for line in maps if "p2p-shm" in line]
    return out


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_kinds() -> dict[str, int]:
    """How many descriptors of each kind (socket, anon_inode:[eventpoll], a path...)."""
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            kind = "socket" if target.startswith("socket:") else target
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def die_mid_big_send(rank: int, store_port: int, nbytes: int) -> None:
    ctx = PeerContext(rank, store_port)
    g = ctx.group("shm-death")
    g.send("ready")
    ctx.barrier("shm-death")
    threading.Timer(0.3, lambda: os._exit(3)).start()
    while True:  # many-chunk frames: the receiver is mid-message when we die
        g.send(torch.ones(nbytes // 4), timeout=60)


def recv_until_error(g: CollectiveGroup) -> BaseException:
    while True:
        try:
            g.recv(timeout=60)
        except Exception as exc:
            return exc


def settle(check: Any, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        gc.collect()
        if check():
            return True
        time.sleep(0.1)
    return bool(check())
