"""Opening a process's two collective groups to a channel worker (its link and control group).

Both sides make the groups of one link generation and exchange an empty tensor on each,
so the groups are connected before the first request or payload travels.
"""

from __future__ import annotations

import time

import torch

from p2p_collective import CollectiveGroup, PeerGoneError
from p2p_worker._channels._protocol.errors import ChannelError
from p2p_worker._channels._protocol.proto import (
    Hello,
    control_group_name,
    link_group_name,
    pair,
)
from p2p_worker._runtime._state import WorkerRuntime

REBORN_WAIT = 10.0
"""Seconds a new link waits for a re-created channel worker to replace its dead namesake."""
REBORN_PAUSE = 0.1


def open_groups(
    endpoint: WorkerRuntime, hello: Hello, peer: str, gen: int, timeout: float | None
) -> tuple[CollectiveGroup, CollectiveGroup]:
    """Connect ``(link, control group)`` of generation ``gen`` (the channel worker does the same).

    The channel worker just answered ``hello``, so it lives. A ``PeerGoneError`` here is
    the ended life of an earlier worker of a channel of the same name (at the same
    address) that this process knew, seen before the new worker announced itself: the
    groups are tried again, for up to :data:`REBORN_WAIT` seconds.

    Raises:
        ChannelError: The groups could not be connected within ``timeout``.
    """
    empty = torch.empty(0, dtype=torch.uint8)
    limit = REBORN_WAIT if timeout is None else min(timeout, REBORN_WAIT)
    reborn_until = time.monotonic() + limit
    members = [endpoint.address, hello.address]
    while True:
        collective = endpoint.collective()
        group = pair(
            collective.create_collective_group(
                members, group_name=link_group_name(hello.uid, peer, gen)
            )
        )
        ctl = pair(
            collective.create_collective_group(
                members, group_name=control_group_name(hello.uid, peer, gen)
            )
        )
        try:
            group.recv_tensor(empty, timeout=timeout)
            group.send_tensor(empty, timeout=timeout)
            ctl.send_tensor(empty, timeout=timeout)
            return group, ctl
        except Exception as exc:
            group.close(timeout=0.0)
            ctl.close(timeout=0.0)
            if isinstance(exc, PeerGoneError) and time.monotonic() < reborn_until:
                time.sleep(REBORN_PAUSE)
                continue
            raise ChannelError(
                f"channel {hello.name!r}: could not connect to its channel worker: {exc}"
            ) from exc
