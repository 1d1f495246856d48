"""The links of a weight sync: a dedicated pair group per edge, and an outbox per child.

Weight sync never shares a pair group with a worker's own ``send``/``recv``: each edge
uses the group keyed ``weights.<sync>.<source>.<a>+<b>``, so neither user messages
between the same two workers nor the relay of another source (a shard) can interleave
with a source's buckets. A group that a failure broke is closed and made
again at its next use (both sides do so: the peer sees the close and breaks its side).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TypeAlias

import torch

from p2p_collective import Collective, CollectiveGroup, CollectiveTimeoutError


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (never negative); None for no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def deadline_after(timeout: float | None) -> float | None:
    """The monotonic deadline ``timeout`` seconds from now (None: none)."""
    return None if timeout is None else time.monotonic() + timeout


class Edges:
    """The pair groups of one sync from this worker, one per peer, made on first use."""

    def __init__(self, collective: Collective, me: str, sync: str, source: str) -> None:
        self._coll = collective
        self._me = me
        self._prefix = f"weights.{sync}.{source}."

    def group(self, peer: str) -> CollectiveGroup:
        """The usable group toward ``peer`` (a broken or closed one is made again)."""
        key = self._prefix + "+".join(sorted((self._me, peer)))
        group = self._coll.create_pair_group([self._me, peer], group_name=key)
        if not group.peer_gone:
            stats = group.stats()
            if stats["send"]["broken"] or stats["recv"]["broken"]:
                group.close(timeout=0.0)
                group = self._coll.create_pair_group([self._me, peer], group_name=key)
        return group

    def drop(self, peer: str) -> None:
        """Close the group toward ``peer`` after a failure (the next use makes a new one)."""
        key = self._prefix + "+".join(sorted((self._me, peer)))
        group = self._coll.groups.get(key)
        if group is not None and not group.peer_gone:
            group.close(timeout=0.0)


Payload = Callable[[], "torch.Tensor | None"]
_Job: TypeAlias = tuple[tuple[object, ...], "Payload | None", Callable[[], None]]
"""An outbox job: a header on the wire, the payload if any, and what frees its slot."""


def ready(tensor: torch.Tensor | None) -> Payload | None:
    """The payload function of a tensor at hand (None: no payload)."""
    if tensor is None:
        return None

    def give() -> torch.Tensor:
        return tensor

    return give


class Outbox:
    """Sends to one child in bucket order on a thread of its own.

    Each job is a header object and a function giving the payload (it may wait, for
    instance for the bucket to be applied here first); ``release`` runs once the job is
    sent or dropped. After the first failure every later job is dropped.
    """

    def __init__(
        self,
        group: CollectiveGroup,
        child: str,
        deadline: float | None,
        on_fail: Callable[[str, BaseException], None],
    ) -> None:
        self.child = child
        self.error: BaseException | None = None
        self.sent_bytes = 0
        self._group = group
        self._deadline = deadline
        self._on_fail = on_fail
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, name=f"p2p-weights-to-{child}", daemon=True
        )
        self._thread.start()

    def put(
        self, header: tuple[object, ...], payload: Payload | None, release: Callable[[], None]
    ) -> None:
        """Queue one message (header, then the payload if any)."""
        self._jobs.put((header, payload, release))

    def finish(self) -> None:
        """Wait until every queued job is sent or dropped (the deadline bounds the sends)."""
        self._jobs.put(None)
        left = remaining(self._deadline)
        self._thread.join(None if left is None else left + 5.0)
        if self._thread.is_alive() and self.error is None:
            self.error = CollectiveTimeoutError(
                f"weight sync: sending to {self.child} did not finish in time"
            )

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            header, payload, release = job
            try:
                if self.error is None:
                    self._send(header, payload)
            except BaseException as exc:  # every failure is reported once
                self.error = exc
                self._on_fail(self.child, exc)
            finally:
                release()

    def _send(self, header: tuple[object, ...], payload: Payload | None) -> None:
        tensor = None if payload is None else payload()
        self._group.send(header, timeout=remaining(self._deadline))
        if tensor is not None:
            self._group.send_tensor(tensor, timeout=remaining(self._deadline))
            self.sent_bytes += tensor.numel() * tensor.element_size()
