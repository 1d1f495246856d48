"""Errors of the worker layer: a worker's failure, the cluster's, and short resources."""

from __future__ import annotations

from p2p_asyncwork import P2PError


class WorkerError(P2PError):
    """A worker failed, or the worker layer could not do what was asked.

    When a worker's method raises, the caller receives a ``WorkerError`` that names the
    group, the rank and the method, and carries the remote traceback as text (the
    original exception is its ``__cause__`` when it could be pickled). The other
    workers of the group and the driver keep running.

    Attributes:
        group_name: Name of the worker group, or ``None`` when not about one worker.
        rank: Rank of the failing worker in its group, or ``None``.
        method: Name of the method that failed (``"__init__"`` for a failed start).
        remote_traceback: The traceback formatted in the worker process, or ``None``.

    Example:
        >>> err = WorkerError("boom", group_name="g", rank=1, method="step")
        >>> (err.group_name, err.rank, err.method)
        ('g', 1, 'step')
    """

    def __init__(
        self,
        message: str,
        *,
        group_name: str | None = None,
        rank: int | None = None,
        method: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.group_name = group_name
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback


class ClusterError(WorkerError):
    """The Ray cluster could not be started, reached, or used (rendezvous store, nodes)."""


class PlacementError(ClusterError):
    """The cluster lacks the nodes, CPUs or GPUs a placement asks for.

    Raised before any worker starts when the cluster's totals are short, and after the
    launch timeout when the resources exist but stay held by someone else.
    """
