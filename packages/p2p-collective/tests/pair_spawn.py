"""Spawned members for the unit tests of ``p2p_worker._raycoll`` (no Ray).

:func:`run_members` starts one spawned process per member; they meet through a
``TCPStore`` of the test's process. Each builds a ``p2p_collective.Collective`` named
``<key>-<rank>`` (shared memory on or off per member), runs the test's ``body`` and puts
``(rank, *what body returned)`` on a queue, or ``(rank, repr(error), [])`` when it
raised, so a failure reaches the test as a value instead of a hang.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

Body = Callable[..., tuple[Any, ...]]
"""``body(coll, rank, key, *args)``: a member's work; a module-level function."""


def _member(
    body: Body, rank: int, port: int, key: str, shm: bool, args: tuple[Any, ...], out: Any
) -> None:
    from p2p_collective import Collective, CollectiveConfig

    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
    )
    coll = Collective(
        f"{key}-{rank}", store, config=CollectiveConfig(shared_memory=shm), timeout=60
    )
    try:
        out.put((rank, *body(coll, rank, key, *args)))
    except BaseException as exc:  # reported to the test, never a silent hang
        out.put((rank, repr(exc), []))
    finally:
        coll.close()


def run_members(
    body: Body,
    key: str,
    shm: tuple[bool, ...],
    args: tuple[tuple[Any, ...], ...] | None = None,
    timeout: float = 90.0,
    results: int | None = None,
) -> list[Any]:
    """Run ``body`` in ``len(shm)`` spawned members; their results sorted by rank.

    Args:
        body: What each member runs (see :data:`Body`).
        key: Names this run's members and groups (unique per test).
        shm: Per member, whether its Collective may use shared memory.
        args: Per member, more arguments for ``body`` (default: none).
        timeout: Seconds to wait for each member's result.
        results: How many results to wait for (default: one per member; fewer when a
            member is meant to die without one).
    """
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    extra = args or ((),) * len(shm)
    procs = [
        ctx.Process(target=_member, args=(body, r, store.port, key, on, extra[r], out))
        for r, on in enumerate(shm)
    ]
    for p in procs:
        p.start()
    try:
        return sorted(
            out.get(timeout=timeout) for _ in range(len(procs) if results is None else results)
        )
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
