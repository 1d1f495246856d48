"""A target of a sharded source: pull every shard at once; together they fill the model.

Each worker of a sharded trainer pushes the part of the state dict it holds
(``push_weights(..., partial=True)``); a target pulls from all of them in parallel, one
:class:`~p2p_worker.WeightReceiver` per shard, each relaying its own shard. The version
counts only when every shard delivered it and the shards together filled every key of
the target exactly once.
"""

from __future__ import annotations

from collections import Counter
from typing import cast

from p2p_asyncwork import AsyncWork
from p2p_asyncwork.internal import check_timeout
from p2p_worker._weights._errors import WeightSyncError
from p2p_worker._weights._layout import named_tensors, target_entries
from p2p_worker._weights._pipeline import run_async
from p2p_worker._weights._target import DEFAULT_PULL_TIMEOUT, WeightReceiver

_GRACE = 5.0  # seconds past a shard's own timeout before its handle counts as lost


class ShardedReceiver:
    """Pulls one version from every shard of a sharded source into one model.

    Args:
        receivers: One :class:`WeightReceiver` per source shard.

    Example:
        >>> version = self.pull_weights(model, "trainer", [0, 1, 2, 3])  # doctest: +SKIP
    """

    def __init__(self, receivers: list[WeightReceiver]) -> None:
        self.receivers = receivers
        self.source = tuple(r.source for r in receivers)

    @property
    def version(self) -> int | None:
        """The version every shard holds bit-exactly, or None."""
        versions = {r.version for r in self.receivers}
        return versions.pop() if len(versions) == 1 else None

    @property
    def torn(self) -> bool:
        """Whether a shard is torn or the shards hold different versions."""
        return any(r.torn for r in self.receivers) or (
            self.version is None and any(r.version is not None for r in self.receivers)
        )

    @property
    def progress(self) -> tuple[int, int]:
        """Buckets applied and buckets in all, over the shards."""
        return (
            sum(r.progress[0] for r in self.receivers),
            sum(r.progress[1] for r in self.receivers),
        )

    def pull(
        self, model: object, *, async_op: bool = False, timeout: float | None = DEFAULT_PULL_TIMEOUT
    ) -> int | AsyncWork[int]:
        """Pull every shard in parallel (see :meth:`WeightReceiver.pull`).

        Raises:
            TypeError, ValueError: ``model`` or ``timeout`` is unusable.
            WeightSyncError: A shard failed, the shards sent different versions, or they
                left a key unfilled or filled one twice.
        """
        tensors, _ = named_tensors(model, "model")
        _, keys = target_entries(tensors, "model")
        limit = check_timeout(timeout, "timeout")
        if async_op:
            return run_async(lambda: self._pull(model, keys, limit), "p2p-weights-pull-shards")
        return self._pull(model, keys, limit)

    def _pull(self, model: object, keys: list[str], limit: float | None) -> int:
        works = [
            cast("AsyncWork[int]", r.pull(model, async_op=True, timeout=limit))
            for r in self.receivers
        ]
        versions: list[int] = []
        errors: list[WeightSyncError] = []
        for work in works:
            try:
                versions.append(work.wait(timeout=None if limit is None else limit + _GRACE))
            except WeightSyncError as exc:
                errors.append(exc)
        if errors:
            err = WeightSyncError(
                "; ".join(str(e) for e in errors),
                version=errors[0].version,
                failed={k: v for e in errors for k, v in e.failed.items()},
                torn=self.torn,
            )
            err.__cause__ = errors[0].__cause__
            raise err
        filled = Counter(k for r in self.receivers for k in r.keys)
        twice = sorted(k for k, n in filled.items() if n > 1)
        missing = [k for k in keys if k not in filled]
        if twice or missing or len(set(versions)) != 1:
            why = (
                f"shards {self.source} sent versions {versions}, filled {twice[:5]} twice and"
                f" left {missing[:5]} unfilled"
            )
            raise WeightSyncError(
                f"weight sync: a sharded pull is inconsistent: {why}",
                version=versions[0],
                failed={"shards": why},
                torn=self.torn,
            )
        return versions[0]
