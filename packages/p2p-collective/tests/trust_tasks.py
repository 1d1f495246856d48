"""Code run inside the spawned processes of test_trust.py (object policy, job token)."""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing as mp
import os
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from p2p_collective import Collective, CollectiveConfig, create_multi_group

PLAIN = CollectiveConfig(object_policy="plain", object_allowlist=("trust_tasks:Allowed",))


@dataclasses.dataclass
class Allowed:
    weights: torch.Tensor
    step: int
    note: str = "allowed"


@dataclasses.dataclass
class NotAllowed:
    weights: torch.Tensor
    step: int


class Evil:
    """Unpickling it would create a directory: proof that code ran in the receiver."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.mkdir, (self.path,))


def plain_values() -> list[Any]:
    """Plain data the ``plain`` policy must accept, deterministic on both sides."""
    return [
        None,
        {"step": 3, "loss": 0.25, "ok": True, "z": 1 + 2j, "raw": b"\x00\x01"},
        [1, "two", (3.0, None), {4, 5}, frozenset({"x"}), bytearray(b"ba")],
        OrderedDict([("b", 1), ("a", [2])]),
        (torch.Size([2, 3]), torch.float16, torch.bfloat16),
        {"a": torch.arange(4), "b": torch.ones(2, 2)},
        {3: torch.ones(2), (1, "k"): torch.zeros(1)},
        [torch.full((3,), 7.0), torch.arange(2)],
    ]


def store_client(port: int) -> Any:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``(error type name, message)``."""
    try:
        return ("ok", fn())
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def listening_sockets() -> list[tuple[str, int]]:
    """``(ip, port)`` of every TCP socket of this process in the LISTEN state."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state != "0A" or inode not in inodes:
                    continue
                hex_ip, hex_port = local.split(":")
                assert len(hex_ip) == width
                raw = bytes.fromhex(hex_ip)
                # /proc prints each 32-bit word in host (little-endian) order
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                if width == 8:
                    ip = ".".join(str(b) for b in words)
                else:
                    ip = ":".join(words[i : i + 2].hex() for i in range(0, 16, 2))
                found.append((ip, int(hex_port, 16)))
    return found


# -- object policy, two members -------------------------------------------------------------


def policy_pair(port: int, rank: int, gname: str, evil_path: str) -> Any:
    """Rank 0 sends a sequence of payloads; rank 1 (policy ``plain``) receives them."""
    names = ["sender", "receiver"]
    coll = Collective(names[rank], store_client(port), config=PLAIN, timeout=60)
    group = coll.create_collective_group(names, gname)
    try:
        payloads: list[Callable[[], Any]] = [
            *[(lambda v=v: v) for v in plain_values()],
            lambda: Allowed(torch.arange(3), 5, note="hi"),
            lambda: NotAllowed(torch.ones(2), 6),
            lambda: Evil(evil_path),
            lambda: {"nested": torch.ones(2), "step": 1},
            lambda: "still in step",
            lambda: {"after": torch.arange(5)},
        ]
        if rank == 0:
            for make in payloads:
                group.send(make(), timeout=60)
            return group.recv(timeout=60)  # the receiver's all-clear
        got = [outcome(lambda: group.recv(timeout=60)) for _ in payloads]
        group.send("done", timeout=60)
        return [(status, repr(v) if status == "ok" else v) for status, v in got]
    finally:
        coll.close()


def policy_multi(port: int, rank: int, gname: str, evil_path: str) -> Any:
    """Three members (policy ``plain``): rank 0 broadcasts refused and accepted objects."""
    names = ["m0", "m1", "m2"]
    coll = Collective(names[rank], store_client(port), config=PLAIN, timeout=60)
    group = create_multi_group(coll, names, group_name=gname)
    try:
        seq: list[Any] = [
            {"step": 1, "shape": torch.Size([2])},
            Evil(evil_path),
            # Pickled whole (a dataclass nested in a dict): the first refused global
            # in the stream is named, here the dataclass ahead of the Evil.
            {"d": NotAllowed(torch.ones(1), 1), "k": Evil(evil_path)},
            {Evil(evil_path): torch.arange(3), "ok": torch.ones(2)},  # refused key, tensors
            {"w": torch.ones(3)},
            "after",
        ]
        out = []
        for obj in seq:
            res = outcome(lambda obj=obj: group.broadcast(obj if rank == 0 else None, src=0))
            out.append((res[0], repr(res[1]) if res[0] == "ok" else res[1]))
        red = group.allreduce(torch.full((2,), float(rank + 1)), timeout=60)
        out.append(("allreduce", red.tolist()))
        return out
    finally:
        coll.close()


# -- job token --------------------------------------------------------------------------------


def token_pair(port: int, rank: int, cases: list[tuple[str, Any, Any]], env: str | None) -> Any:
    """For each ``(group, token of rank 0, token of rank 1)``: meet and pass one message.

    A token of ``"env"`` means: from $P2P_JOB_TOKEN, which is ``env`` in this process.
    """
    if env is not None:
        os.environ["P2P_JOB_TOKEN"] = env
    names = ["tok-a", "tok-b"]
    store = store_client(port)
    results = []
    for gname, *tokens in cases:
        kwargs = {} if tokens[rank] == "env" else {"job_token": tokens[rank]}
        coll = Collective(names[rank], store, timeout=20, **kwargs)
        group = coll.create_collective_group(names, gname)
        if rank == 0:
            results.append(outcome(lambda g=group, n=gname: g.send(f"hi {n}", timeout=30)))
        else:
            results.append(outcome(lambda g=group: g.recv(timeout=30)))
        coll.close()
    return results


def token_multi(port: int, rank: int, tokens: list[str], gname: str) -> Any:
    """Three members, tokens by rank; return the outcome of one allreduce."""
    names = ["t0", "t1", "t2"]
    coll = Collective(names[rank], store_client(port), timeout=20, job_token=tokens[rank])
    group = create_multi_group(coll, names, group_name=gname)
    try:
        return outcome(lambda: group.allreduce(torch.ones(2), timeout=30).tolist())
    finally:
        coll.close()


# -- listeners ----------------------------------------------------------------------------------


def listeners(port: int, rank: int, gname: str) -> Any:
    """Connect a two-party group (ranks 0, 1) and a 3-member group; report listeners."""
    names = ["l0", "l1", "l2"]
    coll = Collective(names[rank], store_client(port), timeout=60, job_token="t")
    try:
        if rank < 2:
            pair = coll.create_collective_group(names[:2], gname)
            other = names[1 - rank]
            work = pair.send(f"from {names[rank]}", async_op=True, timeout=60)
            assert pair.recv(timeout=60) == f"from {other}"
            work.wait(timeout=60)
        multi = create_multi_group(coll, names, group_name=gname + "-multi")
        assert multi.allreduce(torch.ones(1), timeout=60).tolist() == [3.0]
        found = listening_sockets()
        multi.barrier(timeout=60)
        return found
    finally:
        coll.close()


# -- runner -------------------------------------------------------------------------------------


def _child(fn: Callable[..., Any], port: int, rank: int, args: tuple[Any, ...], q: Any) -> None:
    torch.set_num_threads(1)
    try:
        q.put((rank, "ok", fn(port, rank, *args)))
    except BaseException:
        q.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any], port: int, args_by_rank: list[tuple[Any, ...]], timeout: float
) -> list[Any]:
    """Run ``fn(port, rank, *args)`` in one spawned process per rank; return the results."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(fn, port, rank, args, q), daemon=True)
        for rank, args in enumerate(args_by_rank)
    ]
    for p in procs:
        p.start()
    try:
        got = dict((r, (s, v)) for r, s, v in (q.get(timeout=timeout) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    for rank in sorted(got):
        status, value = got[rank]
        if status != "ok":
            raise AssertionError(f"rank {rank} failed:\n{value}")
    return [got[r][1] for r in range(len(procs))]
