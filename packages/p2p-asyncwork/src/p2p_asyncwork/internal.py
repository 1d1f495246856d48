"""What the p2p packages above build on beyond the user-facing names of p2p_asyncwork.

:func:`check_timeout` is the stack's one reading of a ``timeout`` argument: every blocking
call of p2p-collective and p2p-worker passes its argument through it, so ``True``, NaN,
a negative number or a string is refused everywhere with the same message, and the
call's meaning of ``None`` is named in it. Stable within one release of the p2p stack,
not part of the user-facing API that ``p2p_asyncwork.__all__`` lists.
"""

from __future__ import annotations

import math

NO_LIMIT = "no limit"
"""What ``None`` means for queue-like calls (``Channel.put``/``get``, the weight sync)."""
CONFIGURED = "the configured op_timeout"
"""What ``None`` means for group operations and ``Worker.send``/``recv``."""


def check_timeout(value: object, arg: str = "timeout", *, none: str = NO_LIMIT) -> float | None:
    """Return ``value`` as float seconds, or None; refuse anything else, naming ``arg``.

    Accepted: an ``int`` or ``float`` >= 0 (``float("inf")`` is no limit), or ``None``,
    whose meaning at the calling API ``none`` states for the error message.

    Raises:
        ValueError: ``value`` is a bool, not a number, NaN, or negative.

    Example:
        >>> check_timeout(2)
        2.0
        >>> check_timeout(None) is None
        True
        >>> check_timeout(float("nan"), "put(timeout=)")
        Traceback (most recent call last):
        ...
        ValueError: put(timeout=): got nan; allowed: seconds >= 0, float('inf') for no limit, or None (no limit)
    """  # noqa: E501
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or value < 0
    ):
        raise ValueError(
            f"{arg}: got {value!r}; allowed: seconds >= 0, float('inf') for no limit,"
            f" or None ({none})"
        )
    return float(value)


__all__ = ["CONFIGURED", "NO_LIMIT", "check_timeout"]
