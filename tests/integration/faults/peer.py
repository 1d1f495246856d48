"""Code that runs inside the spawned processes of the fault-injection tests.

A peer process holds one ``Collective`` named after its role and serves tasks from its
command queue until told to stop (or until the test kills it): each task is a module-level
function ``task(ctx, *args)`` whose return value (or traceback) goes back to the test.
Tasks that run until the process is killed report their progress through the rendezvous
store (``progress/<name>/<key>`` counters), which the test polls.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from p2p_collective import Collective, CollectiveConfig, CollectiveGroup

STORE_TIMEOUT = datetime.timedelta(seconds=60)


class PeerContext:
    """What a task sees: the process's name, its store client and its Collective."""

    def __init__(self, name: str, store_port: int, config: dict[str, Any] | None) -> None:
        self.name = name
        self.store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=STORE_TIMEOUT)
        cfg = CollectiveConfig(**config) if config else CollectiveConfig(init_timeout=30.0)
        self.collective = Collective(name, self.store, config=cfg)

    def group(self, peer: str, group_name: str | None = None) -> CollectiveGroup:
        return self.collective.create_collective_group([self.name, peer], group_name)

    def progress(self, key: str, amount: int = 1) -> None:
        self.store.add(f"progress/{self.name}/{key}", amount)


def serve(
    name: str, store_port: int, config: dict[str, Any] | None, commands: Any, results: Any
) -> None:
    """Serve tasks until ``None`` arrives; the process's main loop."""
    ctx = PeerContext(name, store_port, config)
    results.put(("ok", os.getpid()))
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


def store_host(results: Any) -> None:
    """Run a TCPStore server on loopback until killed; report its port first."""
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT
    )
    results.put(("ok", server.port))
    while True:
        time.sleep(3600)


def big_tensor(nbytes: int) -> torch.Tensor:
    """A deterministic int64 tensor of ``nbytes`` bytes (its values are its indices)."""
    return torch.arange(nbytes // 8, dtype=torch.int64)


# -- tasks --------------------------------------------------------------------------------


def t_hello(ctx: PeerContext, peer: str, gname: str | None) -> str:
    """Exchange one small message each way (the peer runs ``t_hello`` too)."""
    g = ctx.group(peer, gname)
    sent = g.send({"hello": ctx.name}, async_op=True, timeout=60)
    got = g.recv(timeout=60)
    sent.wait(timeout=60)
    return str(got["hello"])


def t_echo(ctx: PeerContext, peer: str, gname: str | None, n: int) -> int:
    """Receive ``n`` messages and send each one back, in order."""
    g = ctx.group(peer, gname)
    for _ in range(n):
        g.send(g.recv(timeout=60), timeout=60)
    return n


def t_send_big(ctx: PeerContext, peer: str, gname: str | None, nbytes: int, count: int) -> int:
    """Send ``count`` frames of one ``nbytes`` tensor (``count`` < 0: until killed)."""
    g = ctx.group(peer, gname)
    t = big_tensor(nbytes)
    sent = 0
    while count < 0 or sent < count:
        g.send(t, timeout=120)
        sent += 1
        ctx.progress("sent")
    return sent


def t_recv_big(ctx: PeerContext, peer: str, gname: str | None, nbytes: int, count: int) -> int:
    """Receive ``count`` frames and check them (``count`` < 0: until killed)."""
    g = ctx.group(peer, gname)
    expect = big_tensor(nbytes)
    got = 0
    while count < 0 or got < count:
        t = g.recv(timeout=120)
        if not torch.equal(t, expect):
            raise AssertionError(f"frame {got} differs from what was sent")
        got += 1
        ctx.progress("received")
    return got


def t_hello_then_idle(ctx: PeerContext, peer: str, gname: str | None) -> str:
    """Exchange a hello, then stop reading (and writing) without closing anything."""
    got = t_hello(ctx, peer, gname)
    ctx.progress("idle")
    return got


def t_close_group(ctx: PeerContext, peer: str, gname: str | None) -> bool:
    """Close this side's group (the peer's pending operations should fail)."""
    g = ctx.group(peer, gname)
    g.close()
    return g.closed


def t_cycles(ctx: PeerContext, peer: str, prefix: str, n: int, same_key: bool) -> int:
    """The peer side of the leak cycles: connect, echo once, then close on cue."""
    for i in range(n):
        gname = prefix if same_key else f"{prefix}.{i}"
        g = ctx.group(peer, gname)
        g.send(g.recv(timeout=60), timeout=60)
        ctx.store.wait([f"{prefix}/{i}/go"], STORE_TIMEOUT)
        g.close()
        ctx.store.set(f"{prefix}/{i}/closed", b"1")
    return n
