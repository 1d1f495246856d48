"""Small helpers shared by the config parsers of this package (collective, net_emulation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from p2p_asyncwork import ConfigError


def fail(
    path: str, value: object, allowed: str, what: str = "", choices: tuple[str, ...] = ()
) -> ConfigError:
    """Build the ConfigError every parser raises: key path, value given, what is allowed.

    ``choices`` are the allowed spellings of a string value, for a "did you mean" hint.
    """
    return ConfigError.invalid(path, value, allowed, what=what, choices=choices)


def mapping(
    section: object, path: str, keys: tuple[str, ...], shape: str = "a mapping of keys to values"
) -> Mapping[str, Any]:
    """Check that ``section`` is a mapping whose keys are all in ``keys``; return it."""
    if not isinstance(section, Mapping):
        raise fail(path, section, shape)
    for key, value in section.items():
        if key not in keys:
            raise ConfigError.unknown_key(path, key, value, keys)
    return section
