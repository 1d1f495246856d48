"""Keep Ray's tracing wrapper off an actor class's internal methods.

When Ray turns a class into an actor it wraps every method of the class, inherited ones
and private helpers included, in a function that checks whether tracing is on (and, for
a coroutine method, in one more coroutine). A remote call needs that; a helper that the
actor calls on itself thousands of times a second does not: the channel worker's
per-message path crossed such a wrapper on every helper (measured in ``py-spy``: 2-3 %
of its CPU in the wrappers' own frames).

:func:`untraced_internals` marks a class's private methods (``_name``, not dunders) the
way Ray marks a method it already wrapped, so Ray leaves them as they are. Remote
methods keep their wrapper: tracing, when a user turns it on, still sees every call
made through an actor handle.
"""

from __future__ import annotations

import inspect
from types import FunctionType
from typing import TypeVar

_MARK = "__ray_tracing_wrapped__"  # what Ray sets on a method it has wrapped

C = TypeVar("C", bound=type)


def internal_functions(cls: type) -> list[FunctionType]:
    """The private functions (``_name``, not dunders) defined in ``cls`` itself."""
    return [
        value
        for name, value in vars(cls).items()
        if name.startswith("_") and not name.startswith("__") and inspect.isfunction(value)
    ]


def untraced_internals(cls: C) -> C:
    """Mark :func:`internal_functions` of ``cls`` as already traced; return ``cls``.

    Example:
        >>> @untraced_internals
        ... class A:
        ...     def _helper(self): ...
        ...     def remote(self): ...
        >>> getattr(A._helper, _MARK, False), getattr(A.remote, _MARK, False)
        (True, False)
    """
    for function in internal_functions(cls):
        setattr(function, _MARK, True)
    return cls
