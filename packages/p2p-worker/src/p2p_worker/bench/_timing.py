"""The timed loop both ends of every method run, and the payload cache behind it.

The sender of a cell runs :func:`sender_loop`: for every repetition it starts the
clock, sends the payload, waits for the receiver's one-element acknowledgement and
stops the clock. The receiver runs :func:`receiver_loop`: receive, materialise, check
(the warm-up transfer is compared bit for bit with the expected payload, so a
transport or codec that corrupts data fails the run instead of producing a number),
acknowledge. Repetition 0 is a warm-up and is not returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from p2p_worker.bench._payloads import Payload, make_payload, payload_nbytes, payloads_equal

WARMUP = 1


class PayloadCache:
    """Builds payloads on demand and keeps the most recent one (they can be large)."""

    def __init__(self) -> None:
        self._key: tuple[str, int, int] | None = None
        self._value: Payload | None = None

    def get(self, kind: str, size: int, seed: int = 0) -> Payload:
        """Return the payload of ``(kind, size, seed)``, building it when it is not cached."""
        key = (kind, size, seed)
        if key != self._key:
            self._value = None
            self._value = make_payload(kind, size, seed)
            self._key = key
        assert self._value is not None  # set with the key
        return self._value


class PayloadMismatchError(AssertionError):
    """What arrived is not what was sent (raised on the receiver's warm-up check)."""


def sender_loop(
    send: Callable[[], object], wait_ack: Callable[[], object], reps: int
) -> list[float]:
    """Run ``WARMUP + reps`` transfers; return the ``reps`` timed ones in seconds.

    Args:
        send: sends the payload once (blocking until the transport accepted it).
        wait_ack: blocks until the receiver's acknowledgement of that payload arrived.
        reps: number of timed repetitions.

    Returns:
        The round-trip time of each timed repetition, seconds.
    """
    out = []
    for rep in range(WARMUP + reps):
        start = time.perf_counter()
        send()
        wait_ack()
        elapsed = time.perf_counter() - start
        if rep >= WARMUP:
            out.append(elapsed)
    return out


def receiver_loop(
    receive: Callable[[], object],
    send_ack: Callable[[], None],
    reps: int,
    expected: object,
    what: str,
) -> None:
    """Receive ``WARMUP + reps`` payloads, checking the first one against ``expected``.

    Raises:
        PayloadMismatchError: the warm-up payload differs from ``expected``.
    """
    for rep in range(WARMUP + reps):
        got = receive()
        if rep == 0 and not payloads_equal(got, expected):
            raise PayloadMismatchError(f"{what}: the received payload differs from the one sent")
        del got
        send_ack()


def nbytes_of(kind: str, size: int, cache: PayloadCache) -> int:
    """Logical bytes of the cached payload of a cell."""
    return payload_nbytes(cache.get(kind, size))
