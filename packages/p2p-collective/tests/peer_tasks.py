"""Code of the spawned processes of test_peer_fate.py: victims, bystanders, fresh peers."""

from __future__ import annotations

import datetime
import os
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from collective_tasks import suite_config

__all__ = ["suite_config", "torch"]

from p2p_collective import Collective, PeerGoneError, create_multi_group


def client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))


def pair_victim(port: int, name: str, peer: str, gname: str, first: str) -> None:
    """Meet ``peer`` on one direction (``first``: "send" or "recv"), then wait to be killed."""
    coll = Collective(name, client(port), timeout=30.0, config=suite_config())
    g = coll.create_collective_group([name, peer], gname)
    if first == "send":
        g.send("hello", timeout=60)
    else:
        assert g.recv(timeout=60) == "hello"
    time.sleep(600)


def pair_fresh(port: int, name: str, peer: str, gname: str, results: Any) -> None:
    """A new incarnation of a killed peer: receive one object and echo it back."""
    try:
        coll = Collective(name, client(port), timeout=30.0, config=suite_config())
        g = coll.create_collective_group([name, peer], gname)
        obj = g.recv(timeout=60)
        g.send(("echo", obj), timeout=60)
        results.put(("ok", g.stats()["recv"]["transport"]))
        coll.close()
    except BaseException:
        results.put(("error", traceback.format_exc()))


def retry_while_gone(fn: Any, limit: float = 60.0) -> Any:
    """Call ``fn`` until it stops raising PeerGoneError (the fresh peer has announced)."""
    end = time.monotonic() + limit
    while True:
        try:
            return fn()
        except PeerGoneError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def member(port: int, name: str, names: list[str], gname: str, role: str, results: Any) -> None:
    """One member of an N-member group.

    ``role``: "victim" (one allreduce, then dies in the middle of the next one),
    "survivor" (allreduce, then the allreduce the victim dies in, a later barrier --
    reported at once -- then the group re-created with the fresh member), "fresh" (a
    new incarnation of the victim joining the re-created group).
    """
    try:
        coll = Collective(name, client(port), timeout=30.0, config=suite_config())
        g = create_multi_group(coll, names, gname)
        out: dict[str, Any] = {}
        if role in ("victim", "survivor"):
            t = torch.ones(4)
            g.allreduce(t, timeout=60)
            out["sum"] = t.tolist()
        if role == "victim":
            time.sleep(0.5)  # the others are inside the next allreduce by now
            os._exit(3)
        if role == "survivor":
            t0 = time.monotonic()
            try:
                g.allreduce(torch.ones(1 << 16), timeout=120)
                out["first"] = "no error"
            except Exception as exc:
                out["first"] = type(exc).__name__
                out["first_msg"] = str(exc)
            out["seconds"] = time.monotonic() - t0
            t0 = time.monotonic()
            try:
                g.barrier(timeout=60)
                out["later"] = "no error"
            except Exception as exc:
                out["later"] = type(exc).__name__
            out["later_seconds"] = time.monotonic() - t0
            results.put(("ok", out))  # what the death looked like, before the fresh member
            out = {}
            g.close()
            g = create_multi_group(coll, names, gname)
        t = torch.full((3,), float(names.index(name) + 1))
        retry_while_gone(lambda: g.allreduce(t, timeout=60))
        out["after"] = t.tolist()
        results.put(("ok", out))
        coll.close()
    except BaseException:
        results.put(("error", traceback.format_exc()))
