"""The root error type of the p2p stack and the errors of work handles."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
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

    Every layer builds its messages with :meth:`invalid` and :meth:`unknown_key`, so
    they read alike: ``<path>: got <value>; allowed: <what is allowed>``, with a
    ``did you mean ...?`` hint when the value or key is a near miss.

    Example:
        >>> str(ConfigError.unknown_key("cluster", "colective", {}, ["num_nodes", "collective"]))
        "cluster.colective: unknown key; got {}; allowed: keys num_nodes, collective; did you mean 'collective'?"
    """  # noqa: E501

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    @classmethod
    def invalid(
        cls,
        path: str,
        value: object,
        allowed: str,
        *,
        what: str = "",
        choices: Iterable[str] = (),
    ) -> ConfigError:
        """The error for a bad value: ``<path>: [<what>; ]got <value>; allowed: <allowed>``.

        Args:
            path: the full key path (``cluster.collective.tensor_compression.codec``).
            value: the value given.
            allowed: what is allowed, in words.
            what: an optional reason placed before the value.
            choices: the allowed spellings; a string value close to one of them gets a
                ``did you mean ...?`` hint.
        """
        lead = f"{path}: {what}; " if what else f"{path}: "
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        return cls(f"{lead}got {value!r}; allowed: {allowed}{hint}", path)

    @classmethod
    def unknown_key(
        cls,
        section: str,
        key: object,
        value: object,
        keys: Iterable[str],
        *,
        aliases: Mapping[str, str] | None = None,
    ) -> ConfigError:
        """The error for a key a section does not have, with the closest known key as a hint.

        Args:
            section: the section's key path (``cluster.collective``).
            key: the unknown key.
            value: its value.
            keys: the keys the section accepts.
            aliases: words people use for a known key (``{"algorithm": "codec"}``), hinted
                when no spelling is close.
        """
        keys = list(keys)
        path = f"{section}.{key}" if section else str(key)
        hint = ""
        if isinstance(key, str):
            hint = did_you_mean(key, keys)
            alias = (aliases or {}).get(key.lower())
            if not hint and alias in keys:
                hint = f"; did you mean {alias!r}?"
        listed = ", ".join(keys)
        return cls(f"{path}: unknown key; got {value!r}; allowed: keys {listed}{hint}", path)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to ``word``, or ``""`` if none is close.

    Example:
        >>> did_you_mean("levle", ["level", "codec"]), did_you_mean("zzz", ["level"])
        ("; did you mean 'level'?", '')
    """
    options = [c for c in choices if c != word]
    lowered = {c.lower(): c for c in options}
    if word.lower() in lowered:
        return f"; did you mean {lowered[word.lower()]!r}?"
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
