"""Errors of the ``ray.util.collective``-style layer.

Each type keeps the builtin base that code written for Ray already catches (Ray raises
``RuntimeError`` for a group that is not initialized or initialized twice, ``ValueError``
for a rank out of range, ``AssertionError`` for a bad size or rank at initialization),
with a p2p type on top, so ``except RuntimeError`` and ``except WorkerError`` both work.
Run-time failures of an operation (a member died, a timeout) are the p2p-collective
errors themselves (``PeerError``, ``CollectiveTimeoutError``, ...), which are
``RuntimeError`` s too.
"""

from __future__ import annotations

from p2p_worker._errors import WorkerError


class RayCollectiveError(WorkerError, RuntimeError):
    """A call of :mod:`p2p_worker.compat` was used in a way Ray refuses with ``RuntimeError``.

    Example:
        >>> issubclass(RayCollectiveError, RuntimeError)
        True
    """


class GroupNotInitializedError(RayCollectiveError):
    """The named group is neither initialized in this process nor declared for this actor."""


class GroupExistsError(RayCollectiveError):
    """The group is already initialized in this process, or already declared in this job."""


class CollectiveArgumentError(RayCollectiveError, ValueError):
    """A bad argument: the message names it, the value given and what is allowed.

    Also a ``ValueError`` (what Ray raises for a rank out of range) and, like everything
    here, a ``RuntimeError`` (what Ray raises for a list of the wrong length).
    """


class GroupSpecError(CollectiveArgumentError, AssertionError):
    """A bad ``world_size`` or ``rank`` given to ``init_collective_group``.

    Ray checks these with ``assert``; this error is also an ``AssertionError``.
    """


class TensorTypeError(CollectiveArgumentError, TypeError):
    """An argument is not a ``torch.Tensor`` / ``numpy.ndarray`` (or a list of them)."""


class BackendUnavailableError(CollectiveArgumentError):
    """The backend is unknown, or needs a transport this version does not provide (NCCL).

    Ray raises ``ValueError`` for a backend it has not registered; this is one.
    """


class ReadOnlyArrayWarning(UserWarning):
    """An operation wrote its result into a read-only numpy array, as Ray's library does.

    Issued once per process, at the first such write. A numpy array an actor received
    through Ray (an argument or ``ray.get``) is a read-only view of the object in Ray's
    shared-memory object store, shared with every other reader of that object on the
    node: the result written into it changes what they see. Copy the array first
    (``np.array(a)``) to keep the object unchanged.

    Example:
        >>> issubclass(ReadOnlyArrayWarning, UserWarning)
        True
    """
