"""Code that runs inside the spawned peer processes of the p2p-collective tests.

A peer process serves tasks from its command queue until told to stop: each task is a
module-level function ``task(ctx, *args)`` whose return value (or traceback) goes back to
the test. Keeping the processes warm across tests keeps the suite fast on two cores.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import threading
import time
import traceback
from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist

from p2p_collective import Collective, CollectiveConfig, CollectiveGroup

NAMES = ("peer-a", "peer-b")


@dataclasses.dataclass
class Batch:
    tokens: torch.Tensor
    step: int
    mask: torch.Tensor
    note: str = "batch"


@dataclasses.dataclass(frozen=True)
class Frozen:
    weights: torch.Tensor
    tag: tuple[int, int]


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("Unpicklable refuses to be pickled")


def make_payloads() -> list[tuple[str, Any]]:
    """One payload of every kind (deterministic, so both sides and the test agree)."""
    g = torch.Generator().manual_seed(7)
    return [
        ("tensor", torch.randn(3, 4, generator=g)),
        ("scalar_tensor", torch.tensor(2.5, dtype=torch.float64)),
        ("empty_tensor", torch.empty(0, 5, dtype=torch.int32)),
        ("bool_tensor", torch.tensor([True, False, True])),
        ("bf16_tensor", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)),
        ("complex_tensor", torch.randn(4, dtype=torch.complex64, generator=g)),
        ("list", [torch.arange(5), torch.ones(2, 2), torch.zeros(0)]),
        ("tuple", (torch.full((3,), 9, dtype=torch.int16), torch.randn(2, generator=g))),
        ("dict", {"b": torch.arange(3), "a": torch.ones(1, 2), "c": torch.tensor(1)}),
        ("dict_nonstr_keys", {3: torch.ones(2), (1, "x"): torch.arange(4), None: torch.zeros(1)}),
        (
            "ordered_dict",
            OrderedDict([("w", torch.randn(2, 2, generator=g)), ("b", torch.ones(2))]),
        ),
        ("dataclass", Batch(torch.arange(8), 42, torch.tensor([True, False]), note="hi")),
        ("frozen_dataclass", Frozen(torch.ones(3), (1, 2))),
        ("small_object", {"step": 7, "loss": 0.125, "tags": ["a", "b"]}),
        ("none", None),
        ("large_object", {"blob": b"\x01" * 20000, "text": "y" * 5000}),
        ("mixed_list", [torch.ones(1), 3, "not all tensors"]),
        ("big_dict", {f"layer{i}.weight": torch.full((2,), float(i)) for i in range(300)}),
        ("requires_grad", torch.ones(2, requires_grad=True)),
    ]


def suite_config() -> CollectiveConfig:
    """The config of the suite's Collectives: shared memory unless P2P_TEST_TRANSPORT=gloo."""
    return CollectiveConfig(shared_memory=os.environ.get("P2P_TEST_TRANSPORT", "shm") != "gloo")


class PeerContext:
    """What a task sees: this peer's rank and name, the store, its Collective."""

    def __init__(self, rank: int, store_port: int) -> None:
        self.rank = rank
        self.name = NAMES[rank]
        self.peer = NAMES[1 - rank]
        self.store = dist.TCPStore(
            "127.0.0.1", store_port, is_master=False, timeout=datetime.timedelta(seconds=60)
        )
        # P2P_TEST_TRANSPORT=gloo runs the suite over gloo (the cross-node transport)
        # instead of the same-node shared-memory link.
        self.collective = Collective(self.name, self.store, timeout=30.0, config=suite_config())

    def group(self, group_name: str) -> CollectiveGroup:
        return self.collective.create_collective_group([self.name, self.peer], group_name)

    def barrier(self, key: str) -> None:
        self.store.set(f"barrier/{key}/{self.rank}", b"1")
        self.store.wait([f"barrier/{key}/{r}" for r in (0, 1)], datetime.timedelta(seconds=60))


def serve(rank: int, store_port: int, commands: Any, results: Any) -> None:
    ctx = PeerContext(rank, store_port)
    while True:
        item = commands.get()
        if item is None:
            break
        fn, args = item
        try:
            results.put(("ok", fn(ctx, *args)))
        except BaseException:
            results.put(("error", traceback.format_exc()))
    ctx.collective.close()


# -- tasks ------------------------------------------------------------------------------


def t_send_payloads(ctx: PeerContext, gname: str, async_op: bool) -> dict[str, Any]:
    g = ctx.group(gname)
    works = [g.send(p, async_op=async_op, timeout=60) for _, p in make_payloads()]
    if async_op:
        results = [w.wait(timeout=60) for w in works]
        assert all(r is None for r in results)
    return g.stats()["send"]


def t_recv_payloads(ctx: PeerContext, gname: str, async_op: bool) -> list[Any]:
    g = ctx.group(gname)
    n = len(make_payloads())
    if async_op:
        works = [g.recv(async_op=True, timeout=60) for _ in range(n)]
        return [w.wait(timeout=60) for w in works]
    return [g.recv(timeout=60) for _ in range(n)]


def t_recv_early(ctx: PeerContext, gname: str) -> tuple[Any, bool]:
    g = ctx.group(gname)
    work = g.recv(async_op=True, timeout=60)
    tensor_work = g.recv_tensor(torch.zeros(6), async_op=True, timeout=60)
    pending = not work.done() and not tensor_work.done()
    ctx.barrier(gname)  # the peer sends only after our receives are posted
    return (work.wait(timeout=60), tensor_work.wait(timeout=60), pending)


def t_send_late(ctx: PeerContext, gname: str) -> None:
    g = ctx.group(gname)
    ctx.barrier(gname)
    time.sleep(0.3)
    g.send({"late": torch.arange(3)})
    g.send_tensor(torch.arange(6, dtype=torch.float32))


def t_send_many_threads(ctx: PeerContext, gname: str, threads: int, per: int) -> list[Any]:
    g = ctx.group(gname)
    lock = threading.Lock()
    order: list[tuple[int, int]] = []
    works: list[Any] = []

    def producer(tid: int) -> None:
        for i in range(per):
            with lock:  # record the submission order the group must preserve
                works.append(g.send((tid, i), async_op=True, timeout=120))
                order.append((tid, i))

    ts = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for w in works:
        w.wait(timeout=120)
    return order


def t_recv_many(ctx: PeerContext, gname: str, n: int) -> list[Any]:
    g = ctx.group(gname)
    works = [g.recv(async_op=True, timeout=120) for _ in range(n // 2)]
    got = [w.wait(timeout=120) for w in works]
    got += [g.recv(timeout=120) for _ in range(n - n // 2)]
    return got


def t_send_big(ctx: PeerContext, gname: str, nbytes: int) -> float:
    g = ctx.group(gname)
    t = torch.arange(nbytes // 8, dtype=torch.int64)
    t0 = time.perf_counter()
    g.send([t, t[:10].clone()], timeout=120)
    g.send_tensor(t, timeout=120)
    return time.perf_counter() - t0


def t_recv_big(ctx: PeerContext, gname: str, nbytes: int) -> tuple[bool, bool, int]:
    g = ctx.group(gname)
    expect = torch.arange(nbytes // 8, dtype=torch.int64)
    got = g.recv(timeout=120)
    ok_frame = torch.equal(got[0], expect) and got[0].dtype == torch.int64
    buf = torch.empty(nbytes // 8, dtype=torch.int64)
    g.recv_tensor(buf, timeout=120)
    return ok_frame, torch.equal(buf, expect), g.stats()["recv"]["payload_bytes"]


def t_then_chains(ctx: PeerContext, gname: str) -> list[Any]:
    g = ctx.group(gname)
    out: list[Any] = []
    w = g.recv(async_op=True, timeout=60)
    chained = w.then(lambda d: d["x"] * 2).then(lambda t: float(t.sum()))
    out.append(chained.wait(timeout=60))
    out.append(w.get_last_work() is chained)
    buf = torch.zeros(4)
    w2 = g.recv_tensor(buf, async_op=True, timeout=60)
    out.append(w2.then(lambda t: t.tolist()).wait(timeout=60))
    # a callback that itself receives (on the receiving thread) and returns a work
    w3 = g.recv(async_op=True, timeout=60).then(lambda first: g.recv(async_op=True, timeout=60))
    out.append(w3.wait(timeout=60))
    # a callback that receives synchronously on the direction's own thread
    w4 = g.recv(async_op=True, timeout=60).then(lambda first: (first, g.recv(timeout=60)))
    out.append(w4.wait(timeout=60))
    return out


def t_send_for_chains(ctx: PeerContext, gname: str) -> None:
    g = ctx.group(gname)
    g.send({"x": torch.ones(3)})
    g.send_tensor(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    w = g.send("first", async_op=True).then(lambda _: g.send("second", async_op=True))
    w.wait(timeout=60)
    g.send("third")
    g.send("fourth")


def t_bad_inputs(ctx: PeerContext, gname: str) -> list[str]:
    """Each bad input is refused with a precise error; the group works after each."""
    g = ctx.group(gname)
    nc = torch.arange(12).reshape(3, 4).t()
    cases: list[tuple[str, Any]] = [
        ("send", nc),
        ("send", [torch.ones(2), nc]),
        ("send", (nc,)),
        ("send", {"ok": torch.ones(1), "x": nc}),
        ("send", {5: nc}),
        ("send", Batch(torch.ones(2), 1, nc)),
        ("send", Unpicklable()),
        ("send", {"fn": threading.Lock()}),
        ("send", torch.ones(2, device="meta")),
        ("send", torch.ones(2).to_sparse()),
        ("send_tensor", nc),
        ("send_tensor", [torch.ones(1)]),
        ("recv_tensor", nc),
        ("recv_tensor", "not a tensor"),
        ("timeout", -1.0),
        ("timeout", float("nan")),
        ("timeout", True),
    ]
    messages: list[str] = []
    for i, (op, arg) in enumerate(cases):
        try:
            if op == "send":
                g.send(arg, async_op=i % 2 == 0)
            elif op == "send_tensor":
                g.send_tensor(arg)
            elif op == "recv_tensor":
                g.recv_tensor(arg)
            else:
                g.send(1, timeout=arg)
        except (ValueError, TypeError) as exc:
            messages.append(f"{type(exc).__name__}: {exc}")
        else:
            messages.append("NO ERROR")
        # the group still works; float("inf") is "no limit" for one call
        g.send({"i": i, "t": torch.full((2,), i)}, timeout=float("inf") if i % 2 else None)
    return messages


def t_recv_after_bad_inputs(ctx: PeerContext, gname: str, n: int) -> list[int]:
    g = ctx.group(gname)
    got = []
    for _ in range(n):
        d = g.recv(timeout=float("inf") if len(got) % 2 else 60)
        assert torch.equal(d["t"], torch.full((2,), d["i"]))
        got.append(d["i"])
    return got


def t_mismatch_sender(ctx: PeerContext, gname: str, mode: str) -> Any:
    g = ctx.group(gname)
    outcome = "ok"
    t0 = time.monotonic()
    try:
        if mode == "send_tensor_vs_recv":
            g.send_tensor(torch.arange(16, dtype=torch.int64), timeout=30)
        elif mode in ("large_send_tensor_vs_recv", "send_tensor_longer", "send_tensor_shorter"):
            n = {"send_tensor_longer": 300_000, "send_tensor_shorter": 100}.get(mode, 1 << 20)
            g.send_tensor(torch.ones(n, dtype=torch.uint8), timeout=30)
        elif mode == "send_vs_small_recv_tensor":
            g.send({"k": torch.ones(3)}, timeout=30)  # one message: the tensor is inline
        else:
            g.send({"k": torch.ones(100_000)}, timeout=30)
    except Exception as exc:
        # The receiver refuses the header and hangs up: a payload still to be sent
        # fails with PeerError within seconds, not at its deadline.
        outcome = type(exc).__name__
    elapsed = time.monotonic() - t0
    ctx.barrier(gname)
    return outcome, elapsed


def t_mismatch_receiver(ctx: PeerContext, gname: str, mode: str) -> list[str]:
    from p2p_collective import FramingError, GroupBrokenError

    g = ctx.group(gname)
    out = []
    try:
        if mode in ("send_tensor_vs_recv", "large_send_tensor_vs_recv"):
            g.recv(timeout=30)
        elif mode in ("send_tensor_longer", "send_tensor_shorter"):
            g.recv_tensor(torch.empty(200_000, dtype=torch.uint8), timeout=30)
        elif mode == "send_vs_small_recv_tensor":
            g.recv_tensor(torch.empty(4, dtype=torch.int64), timeout=30)
        else:
            g.recv_tensor(torch.empty(8192, dtype=torch.uint8), timeout=30)
    except FramingError as exc:
        out.append(f"FramingError: {exc}")
    try:
        g.recv(timeout=5)
    except GroupBrokenError as exc:
        out.append(f"GroupBrokenError cause={type(exc.__cause__).__name__}")
    work = g.recv(async_op=True)
    exc2 = work.exception(timeout=5)
    out.append(f"async: {type(exc2).__name__}")
    out.append(f"stats broken={g.stats()['recv']['broken']}")
    ctx.barrier(gname)
    return out


def t_recv_timeout(ctx: PeerContext, gname: str) -> list[str]:
    from p2p_collective import CollectiveTimeoutError, GroupBrokenError

    g = ctx.group(gname)
    assert g.recv(timeout=30) == "hello"  # the link is up
    out = []
    t0 = time.monotonic()
    try:
        g.recv(timeout=1.0)
    except CollectiveTimeoutError as exc:
        out.append(f"timeout after {time.monotonic() - t0:.1f}s: {type(exc).__name__}")
    try:
        g.recv(timeout=1.0)
    except GroupBrokenError as exc:
        out.append(f"broken cause={type(exc.__cause__).__name__}")
    # the other direction is unaffected
    g.send("still fine")
    ctx.barrier(gname)
    return out


def t_timeout_peer(ctx: PeerContext, gname: str) -> Any:
    g = ctx.group(gname)
    g.send("hello")
    got = g.recv(timeout=30)
    ctx.barrier(gname)
    return got


def t_default_pg_untouched(ctx: PeerContext, gname: str, port: int) -> list[float]:
    """A user's default process group and our standalone groups coexist."""
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=ctx.rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=60),
        )
    g = ctx.group(gname)
    t = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(t)
    if ctx.rank == 0:
        g.send(torch.arange(4.0))
        back = g.recv(timeout=30)
    else:
        back = g.recv(timeout=30) * 10
        g.send(back)
    dist.all_reduce(t)
    out = [float(t.sum()), float(back.sum()), float(dist.get_world_size())]
    dist.destroy_process_group()
    return out


def t_close_with_pending(ctx: PeerContext, gname: str) -> list[str]:
    """peer-b closes its group; its queued ops fail, peer-a's pending receive fails fast."""
    from p2p_collective import GroupClosedError

    g = ctx.group(gname)
    if ctx.rank == 0:
        assert g.recv(timeout=30) == "up"
        pending = g.recv(async_op=True, timeout=60)  # the peer closes instead of sending
        ctx.barrier(gname)
        t0 = time.monotonic()
        err = pending.exception(timeout=30)
        return [type(err).__name__, f"{time.monotonic() - t0 < 10}"]
    g.send("up")
    queued = [g.recv(async_op=True, timeout=60) for _ in range(3)]
    ctx.barrier(gname)
    time.sleep(0.2)
    g.close()
    out = [type(w.exception(timeout=10)).__name__ for w in queued]
    try:
        g.send("after close")
    except GroupClosedError:
        out.append("GroupClosedError on send")
    out.append(str(ctx.group(gname) is not g))  # a closed group is replaced in the cache
    return out


def t_recreate(ctx: PeerContext, gname: str) -> list[Any]:
    """The first incarnation uses one direction only; the second uses both."""
    g = ctx.group(gname)
    out: list[Any] = []
    if ctx.rank == 0:
        out.append(g.recv(timeout=30))
    else:
        g.send("from peer-b")
    ctx.barrier(gname + "/used")
    g.close()
    ctx.barrier(gname + "/closed")
    g2 = ctx.group(gname)
    assert g2 is not g
    if ctx.rank == 0:
        g2.send("again from peer-a")
        out.append(g2.recv(timeout=30))
    else:
        out.append(g2.recv(timeout=30))
        g2.send("again from peer-b")
    out.append(g2.incarnation(ctx.store))
    return out


def t_hub(ctx: PeerContext, n_peers: int, rounds: int) -> list[int]:
    hub = Collective("hub", ctx.store, timeout=60.0)
    groups = [hub.create_collective_group(["hub", f"spoke{i}"]) for i in range(n_peers)]
    sends = [
        g.send({"to": i, "r": r, "t": torch.full((4,), i)}, async_op=True, timeout=120)
        for r in range(rounds)
        for i, g in enumerate(groups)
    ]
    recvs = [[g.recv(async_op=True, timeout=120) for _ in range(rounds)] for g in groups]
    for w in sends:
        w.wait(timeout=120)
    got = []
    for i, ws in enumerate(recvs):
        vals = [w.wait(timeout=120) for w in ws]
        assert [v["r"] for v in vals] == list(range(rounds)), vals
        assert all(v["from"] == i and torch.equal(v["t"], torch.full((4,), -i)) for v in vals)
        got.append(len(vals))
    hub.close()
    return got


def t_spokes(ctx: PeerContext, n_peers: int, rounds: int) -> list[int]:
    spokes = [Collective(f"spoke{i}", ctx.store, timeout=60.0) for i in range(n_peers)]
    groups = [c.create_collective_group([f"spoke{i}", "hub"]) for i, c in enumerate(spokes)]
    sends = [
        g.send({"from": i, "r": r, "t": torch.full((4,), -i)}, async_op=True, timeout=120)
        for r in range(rounds)
        for i, g in enumerate(groups)
    ]
    got = []
    for i, g in enumerate(groups):
        vals = [g.recv(timeout=120) for _ in range(rounds)]
        assert [v["r"] for v in vals] == list(range(rounds))
        assert all(v["to"] == i and torch.equal(v["t"], torch.full((4,), i)) for v in vals)
        got.append(len(vals))
    for w in sends:
        w.wait(timeout=120)
    for c in spokes:
        c.close()
    return got


# -- peer-death tasks (run in dedicated processes, not the warm pair) ---------------------


def die_mid_send(rank: int, store_port: int, nbytes: int) -> None:
    ctx = PeerContext(rank, store_port)
    g = ctx.group("death")
    g.send("ready")
    ctx.barrier("death")
    threading.Timer(float(os.environ.get("DIE_AFTER", "0.2")), lambda: os._exit(3)).start()
    # a large frame: the receiver has the header and waits on the payload when we die
    while True:
        g.send(torch.ones(nbytes // 4), timeout=60)


def t_send_first(ctx: PeerContext, gname: str, rounds: int) -> list[Any]:
    """Both peers run this: send, then receive, ``rounds`` times (no one receives first).

    One ordered exchange comes first: each direction connects at its first operation,
    and a send's connection waits for the peer's receiving side to join.
    """
    g = ctx.group(gname)
    if ctx.name == "peer-a":
        g.send("hello", timeout=30)
        assert g.recv(timeout=30) == "hello"
    else:
        assert g.recv(timeout=30) == "hello"
        g.send("hello", timeout=30)
    got = []
    for i in range(rounds):
        g.send({"from": ctx.name, "i": i}, timeout=30)
        got.append(g.recv(timeout=30))
    return got


def t_reply_then_busy(ctx: PeerContext, gname: str, busy: float) -> Any:
    """Receive one object, then stay away from the group ``busy`` seconds, then receive."""
    g = ctx.group(gname)
    first = g.recv(timeout=30)
    time.sleep(busy)
    return first, g.recv(timeout=30)


def t_send_to_busy(ctx: PeerContext, gname: str) -> float:
    """Send two small objects; return how long the second send took."""
    g = ctx.group(gname)
    g.send("first", timeout=30)
    time.sleep(0.2)  # the peer is now busy elsewhere; its next header receive is due
    t0 = time.monotonic()
    g.send("second", timeout=30)
    return time.monotonic() - t0


def t_both_send_first_on_a_new_group(ctx: PeerContext, gname: str) -> tuple[str, Any]:
    """Send first on a brand-new group (as the peer does), with a 2 s init_timeout."""
    from p2p_collective import Collective, CollectiveTimeoutError

    me, peer = f"{ctx.name}/{gname}", f"{ctx.peer}/{gname}"
    coll = Collective(me, ctx.store, timeout=2.0, config=suite_config())
    g = coll.create_collective_group([me, peer])
    try:
        g.send("first", timeout=30)
        outcome = "sent"
    except CollectiveTimeoutError as exc:
        outcome = str(exc)
    ctx.barrier(gname + "/failed")
    # nothing went on the wire: the group still works once one side receives first
    if ctx.name == "peer-a":
        got = g.recv(timeout=30)
        g.send("after", timeout=30)
    else:
        g.send("after", timeout=30)
        got = g.recv(timeout=30)
    coll.close()
    return outcome, got
