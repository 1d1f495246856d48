"""What a push did: who holds which version, how the buckets travelled, what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PushReport:
    """What a push did.

    Attributes:
        version: The version pushed.
        targets: Target name -> the version it confirmed holding (None: torn or unknown).
        failed: Target name -> why it did not confirm ``version``.
        buckets: Number of buckets.
        bucket_bytes: The bucket size used (set, or chosen for the model).
        modes: How the source prepared the buckets: ``{"full": n, "packed": n, "delta":
            n, "same": n}`` (``packed``: in full, compressed without loss, for the
            children that take it by value; a child that lacks a delta's base gets that
            bucket in full, packed where packing is on).
        sent_bytes: Payload bytes the source put on the wire (resends to orphans included).
        shared_bytes: Bytes the source lent to targets on its own node through its shared
            arena (each bucket once, however many of them read it).
        unshared: Same-node target -> why it got its buckets by value instead.
        full_bytes: Bytes of one full copy in the targets' dtypes.
        base_bytes: Bytes of the delta base the source keeps (0 without one).
        seconds: Wall time of the push.
        order: The relay order of the targets (the first one hears from the source).

    Example:
        >>> report = PushReport(version=3, targets={"rollout:0": 3}, modes={"delta": 2})
        >>> report.failed
        {}
    """

    version: int
    targets: dict[str, int | None] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    buckets: int = 0
    bucket_bytes: int = 0
    modes: dict[str, int] = field(default_factory=dict)
    sent_bytes: int = 0
    shared_bytes: int = 0
    unshared: dict[str, str] = field(default_factory=dict)
    full_bytes: int = 0
    base_bytes: int = 0
    seconds: float = 0.0
    order: tuple[str, ...] = ()
