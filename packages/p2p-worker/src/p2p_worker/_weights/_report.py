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
        modes: How the first target got the buckets: ``{"full": n, "delta": n, "same": n}``.
        sent_bytes: Payload bytes the source put on the wire (resends to orphans included).
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
    full_bytes: int = 0
    base_bytes: int = 0
    seconds: float = 0.0
    order: tuple[str, ...] = ()
