"""One parser for byte sizes written by people (``64KiB``, ``1M``, ``2GB``), shared by every CLI.

The rule is the one GNU coreutils (``dd``, ``head -c``, ``truncate``) use, case ignored:

* a bare number, or a number followed by ``B``, is bytes;
* ``K``, ``M``, ``G``, ``T`` and ``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of 1024;
* ``kB``, ``MB``, ``GB``, ``TB`` are powers of 1000.

So ``1M`` and ``1MiB`` are 1,048,576 bytes and ``1MB`` is 1,000,000. A fraction is
allowed when it comes to a whole number of bytes (``1.5KiB`` is 1536; ``1.5`` is refused).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

_BINARY: Final = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_DECIMAL: Final = {"kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
SIZE_UNITS: Final[dict[str, int]] = {
    "": 1,
    "b": 1,
    **_BINARY,
    **{f"{k}ib": v for k, v in _BINARY.items()},
    **_DECIMAL,
}
"""Every accepted unit (lower case) and its value in bytes."""

SIZE_RULE: Final = (
    "a number of bytes with an optional unit: K/KiB, M/MiB, G/GiB, T/TiB are powers of "
    "1024; kB, MB, GB, TB powers of 1000 (e.g. 4096, 64KiB, 1M, 2GB)"
)
"""The rule as error messages and ``--help`` texts state it."""

_SIZE_RE: Final = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*")


def _format_bytes(value: int) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return "1 byte" if value == 1 else f"{value} bytes"


def parse_size(
    text: str, *, minimum: int = 1, maximum: int | None = None, name: str = "size"
) -> int:
    """Parse a size such as ``"64KiB"``, ``"1M"``, ``"2GB"`` or ``"4096"`` into bytes.

    ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB``, ``T``/``TiB`` are powers of 1024;
    ``kB``/``MB``/``GB``/``TB`` are powers of 1000; a bare number (or ``B``) is bytes.
    Case is ignored and blanks around the number and unit are allowed.

    Args:
        text: the size as a person wrote it.
        minimum: smallest allowed result in bytes (default 1: zero is refused).
        maximum: largest allowed result in bytes, or None for no bound.
        name: what the size is, for the error message (an option such as ``--size``).

    Returns:
        The size in bytes.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``text`` is not a size in this rule, is not a whole number of bytes,
            or is outside ``minimum`` .. ``maximum``; the message names ``name``, the
            text given and what is allowed.

    Example:
        >>> parse_size("64KiB"), parse_size("1M"), parse_size("1MB"), parse_size("1.5k")
        (65536, 1048576, 1000000, 1536)
        >>> parse_size("0")
        Traceback (most recent call last):
        ...
        ValueError: size: got '0' = 0 bytes; allowed: at least 1 byte
    """
    if not isinstance(text, str):
        raise TypeError(f"{name}: got {type(text).__name__} {text!r}; allowed: a str like '64KiB'")
    match = _SIZE_RE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in SIZE_UNITS:
        raise ValueError(f"{name}: got {text!r}; allowed: {SIZE_RULE}")
    exact = Fraction(match.group(1)) * SIZE_UNITS[unit]
    if exact.denominator != 1:
        raise ValueError(f"{name}: got {text!r} = {float(exact)} bytes; allowed: whole bytes")
    value = int(exact)
    if value < minimum:
        raise ValueError(
            f"{name}: got {text!r} = {value} bytes; allowed: at least {_format_bytes(minimum)}"
        )
    if maximum is not None and value > maximum:
        raise ValueError(
            f"{name}: got {text!r} = {value} bytes; allowed: at most {_format_bytes(maximum)}"
        )
    return value
