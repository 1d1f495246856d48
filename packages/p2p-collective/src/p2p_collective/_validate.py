"""Small helpers shared by the config parsers of this package (collective, net_emulation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from p2p_asyncwork import ConfigError


def fail(path: str, value: object, allowed: str, what: str = "") -> ConfigError:
    """Build the ConfigError every parser raises: key path, value given, what is allowed."""
    lead = f"{path}: {what}; " if what else f"{path}: "
    return ConfigError(f"{lead}got {value!r}; allowed: {allowed}", path=path)


def mapping(
    section: object, path: str, keys: tuple[str, ...], shape: str = "a mapping of keys to values"
) -> Mapping[str, Any]:
    """Check that ``section`` is a mapping whose keys are all in ``keys``; return it."""
    if not isinstance(section, Mapping):
        raise fail(path, section, shape)
    for key, value in section.items():
        if key not in keys:
            raise fail(f"{path}.{key}", value, "keys " + ", ".join(keys), "unknown key")
    return section
