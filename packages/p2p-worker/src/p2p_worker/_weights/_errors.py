"""The error of a weight sync: which target, which version, and whether it is torn."""

from __future__ import annotations

from p2p_worker._errors import WorkerError


class WeightSyncError(WorkerError, RuntimeError):
    """A weight sync failed for one or more targets.

    Raised by the target whose pull failed (it names itself and the version) and by the
    source when any target did not confirm the version (it names every such target). A
    target that raised holds the version it can prove: its old one when none of its
    tensors was touched, none (``torn``) otherwise; the next push repairs it.

    Attributes:
        version: The version being synced.
        failed: Target name -> reason, for every target that did not confirm it.
        torn: Whether the raising target (on a target) now holds a mix of versions.

    Example:
        >>> err = WeightSyncError("sync failed", version=3, failed={"rollout:1": "timeout"})
        >>> err.version, sorted(err.failed)
        (3, ['rollout:1'])
    """

    def __init__(
        self,
        message: str,
        *,
        version: int | None = None,
        failed: dict[str, str] | None = None,
        torn: bool = False,
    ) -> None:
        super().__init__(message)
        self.version = version
        self.failed = dict(failed or {})
        self.torn = torn
