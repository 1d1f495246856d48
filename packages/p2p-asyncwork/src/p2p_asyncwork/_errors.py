"""The root error type of the p2p stack and the errors of work handles."""

from __future__ import annotations

from typing import Any, cast


class P2PError(Exception):
    """Root of every run-time error raised by the p2p packages.

    Each package has one base below it (``CompressionError``, ``CollectiveError``,
    ``WorkerError``). Every subclass pickles with its message and its ``__cause__``,
    so errors survive the trip across a Ray actor boundary.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's default reduce drops __cause__; keep it, and any extra state.
        return (_rebuild_error, (type(self), self.args, self.__cause__, self.__dict__.copy()))


def _rebuild_error(
    cls: type[BaseException],
    args: tuple[Any, ...],
    cause: BaseException | None,
    state: dict[str, Any],
) -> BaseException:
    err = _blank(cls)
    err.args = args
    err.__dict__.update(state)
    err.__cause__ = cause
    return err


def _blank(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with no ``__init__`` run.

    ``cls.__new__(cls)`` is refused ("not safe") when ``cls`` mixes two builtin bases
    with different layouts, e.g. ``RuntimeError`` and ``TimeoutError`` (an ``OSError``):
    then the ``__new__`` of the base that owns the instance layout must be called.
    """
    for klass in cls.__mro__:
        new = vars(klass).get("__new__")
        if new is not None:
            try:
                return cast("BaseException", new(cls))
            except TypeError:
                continue
    return BaseException.__new__(cls)


class WorkError(P2PError):
    """A work handle's operation or callback failed; the original error is the cause."""


class WorkTimeoutError(P2PError, TimeoutError):
    """``wait(timeout=...)`` ran out before the work completed."""


class WorkCancelledError(P2PError):
    """The work was cancelled before it completed."""


class ConfigError(P2PError, ValueError):
    """A configuration value is missing, unknown or out of range.

    Every layer raises this for its section of the job-level config. The message names
    the key path (``cluster.collective.tensor_compression.level``), the value given and
    what is allowed; ``path`` holds the key path.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path
