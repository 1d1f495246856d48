"""Address names: what identifies a process to its peers (a string, or ``get_name()``)."""

from __future__ import annotations


def address_name(address: object, what: str = "address") -> str:
    """The name of an address: a non-empty string, or an object's ``get_name()``.

    Raises:
        TypeError: ``address`` is neither a string nor has ``get_name()``.
        ValueError: The name is empty.
    """
    if isinstance(address, str):
        name = address
    else:
        get_name = getattr(address, "get_name", None)
        if not callable(get_name):
            raise TypeError(
                f"{what}: expected a str or an object with get_name(), got {type(address).__name__}"
            )
        name = get_name()
        if not isinstance(name, str):
            raise TypeError(f"{what}: get_name() returned {type(name).__name__}, expected str")
    if not name:
        raise ValueError(f"{what}: got an empty name; allowed: a non-empty string")
    return name
