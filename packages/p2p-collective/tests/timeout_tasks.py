"""Peer tasks for test_config_timeouts: a Collective built with no timeouts at all."""

from __future__ import annotations

import os
from typing import Any

import torch

from p2p_collective import Collective, CollectiveConfig


def t_no_timeouts(ctx: Any, gname: str) -> list[Any]:
    """Both peers: init_timeout and op_timeout null, per-call timeout None; swap a tensor."""
    config = CollectiveConfig(
        init_timeout=None,
        op_timeout=None,
        shared_memory=os.environ.get("P2P_TEST_TRANSPORT", "shm") != "gloo",
    )
    me, peer = f"{ctx.name}/{gname}", f"{ctx.peer}/{gname}"
    coll = Collective(me, ctx.store, config=config)
    try:
        g = coll.create_collective_group([me, peer])
        mine = torch.arange(1 << 16, dtype=torch.int64) * (ctx.rank + 1)
        if ctx.rank == 0:
            g.send(mine, timeout=None)
            got = g.recv(timeout=None)
        else:
            got = g.recv(timeout=None)
            g.send(mine, timeout=None)
        handle = g.send({"step": ctx.rank}, async_op=True)
        other = g.recv(timeout=None)
        handle.wait(timeout=None)
        return [coll.init_timeout, int(got.sum()), other]
    finally:
        coll.close()
