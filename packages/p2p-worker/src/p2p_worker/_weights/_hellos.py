"""The source's first step of a push: every target's hello, or why it is missing.

A target says hello when it starts pulling; the source waits for every named target's
hello until the join deadline. A receive still waiting then is kept for the next push
rather than timed out: a timed-out receive would break the pair group on this side only.
"""

from __future__ import annotations

from p2p_asyncwork import AsyncWork, wait_any
from p2p_collective import CollectiveGroup, PeerError
from p2p_worker._weights import _messages as m
from p2p_worker._weights._edges import Edges, remaining

POLL = 0.01
"""Seconds between looks at targets that are not connected yet."""
Waiting = tuple[CollectiveGroup, AsyncWork[object]]
"""A target's pair group and its hello's receive."""
HELLO_TIMEOUT = 24 * 3600.0
"""A hello may come pushes later; a dead target fails its receive at once."""


def gather_hellos(
    edges: Edges,
    waiting: dict[str, Waiting],
    names: list[str],
    join_deadline: float | None,
    failed: dict[str, str],
) -> dict[str, m.Hello]:
    """Every target's hello, in ``names`` order; the missing ones go to ``failed``.

    ``waiting`` holds the receives an earlier push left waiting (taken from it, and the
    ones still waiting at ``join_deadline`` put back).
    """
    works: dict[str, Waiting | None] = {n: waiting.pop(n, None) for n in names}
    got: dict[str, m.Hello] = {}
    while works:
        for name, pending in list(works.items()):
            if pending is None:
                group = edges.group(name)
                if not group.peer_gone:  # a dead target may come back until the deadline
                    works[name] = (group, group.recv(async_op=True, timeout=HELLO_TIMEOUT))
                continue
            group, work = pending
            if not work.done():
                continue
            try:
                got[name] = m.from_wire(work.wait(), (m.Hello,), name, "hello")
                del works[name]
            except Exception as exc:
                left = remaining(join_deadline)
                if (group.peer_gone or isinstance(exc, PeerError)) and (left is None or left > 0):
                    works[name] = None  # that life of it died: wait for a new one
                else:
                    edges.drop(name)
                    failed[name] = f"no hello: {exc}"
                    del works[name]
        left = remaining(join_deadline)
        if works and left is not None and left <= 0:
            for name, still in works.items():
                failed[name] = "no hello before join_timeout (dead, or not pulling)"
                if still is not None:
                    waiting[name] = still
            break
        if works:
            # woken by the next hello (or a dead target); a target that is not connected
            # yet (None) is looked at again after POLL
            receives = [p[1] for p in works.values() if p is not None]
            most = None if left is None else max(left, POLL)
            wait_any(receives, timeout=POLL if len(receives) < len(works) else most)
    return {n: got[n] for n in names if n in got}
