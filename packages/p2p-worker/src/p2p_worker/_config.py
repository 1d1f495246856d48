"""The job-level ``cluster:`` configuration, validated once on the driver."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from p2p_asyncwork import ConfigError
from p2p_collective import (
    CollectiveConfig,
    NetEmulationConfig,
    parse_collective_config,
    parse_net_emulation,
)

ConfigSource = Mapping[str, object] | str | os.PathLike[str] | None

_KEYS = ("num_nodes", "collective", "net_emulation")


@dataclass(frozen=True)
class ClusterConfig:
    """The validated ``cluster:`` section of a job's configuration.

    Attributes:
        num_nodes: Number of nodes the job asks for, or ``None`` (use what is there).
        collective: The ``p2p_collective.CollectiveConfig`` every worker's ``Collective``
            is built with (compression, buffer pool, timeouts, and link emulation when
            ``net_emulation`` is set); ``None`` only in a ``ClusterConfig`` built by hand.
        net_emulation: The parsed ``net_emulation`` section, or ``None``.

    Example:
        >>> parse_cluster_config({"cluster": {"num_nodes": 1}}).num_nodes
        1
    """

    num_nodes: int | None = None
    collective: CollectiveConfig | None = None
    net_emulation: NetEmulationConfig | None = None

    @property
    def codec_name(self) -> str | None:
        """The configured compression codec (``"lz4"``/``"zstd"``), or ``None`` when off."""
        compression = getattr(self.collective, "compression", None)
        return None if compression is None else str(compression.codec_name)


def load_config_source(source: ConfigSource) -> object:
    """Turn a mapping, a YAML file path or YAML text into plain data.

    Args:
        source: A mapping (returned as is), a path to a YAML file, YAML text, or ``None``.

    Returns:
        The loaded data (usually a dict), or ``None``.

    Raises:
        TypeError: ``source`` is of another type.
        ValueError: ``source`` looks like a path but no such file exists.
        ConfigError: The YAML does not parse.
    """
    if source is None or isinstance(source, Mapping):
        return source
    if isinstance(source, os.PathLike):
        return _load_yaml(Path(source).read_text(encoding="utf-8"), str(source))
    if not isinstance(source, str):
        raise TypeError(
            f"config: got {type(source).__name__} {source!r}; allowed: a mapping, a YAML file "
            "path or YAML text"
        )
    text = source.strip()
    one_line = "\n" not in text
    is_path = one_line and bool(text) and not text.startswith("{")
    is_path = is_path and (text.endswith((".yaml", ".yml")) or ":" not in text)
    if is_path:
        path = Path(text)
        if not path.is_file():
            raise ValueError(
                f"config: got {source!r}, but no such YAML file exists; allowed: a mapping, "
                "a YAML file path or YAML text"
            )
        return _load_yaml(path.read_text(encoding="utf-8"), text)
    return _load_yaml(source, "<config text>")


def _load_yaml(text: str, origin: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {origin}: not valid YAML: {exc}", "cluster") from exc


def parse_cluster_config(source: ConfigSource, path: str = "cluster") -> ClusterConfig:
    r"""Validate a job's ``cluster:`` configuration.

    The whole tree is checked here, on the driver, before any worker starts: unknown
    keys, wrong types and out-of-range values raise :class:`~p2p_asyncwork.ConfigError`
    naming the key path. The ``collective`` section is parsed by
    ``p2p_collective.parse_collective_config`` and ``net_emulation`` by
    ``p2p_collective.parse_net_emulation``; the link emulation ends up inside the
    collective config, which every worker's ``Collective`` is built with.

    Args:
        source: The job configuration: a mapping, a YAML file path or YAML text. A tree
            with a top-level ``cluster`` key is accepted (its other top-level keys belong
            to the rest of the job and are ignored); otherwise the mapping is taken to be
            the ``cluster`` section itself. ``None`` gives the defaults.
        path: Key path used in error messages.

    Returns:
        The validated :class:`ClusterConfig`.

    Raises:
        ConfigError: A key is unknown, a value has the wrong type or is out of range, or
            the YAML does not parse.
        TypeError: ``source`` is not a mapping, a path, a str or ``None``.
        ValueError: ``source`` names a YAML file that does not exist.

    Example:
        >>> cfg = parse_cluster_config("cluster:\n  num_nodes: 2\n")
        >>> cfg.num_nodes
        2
        >>> parse_cluster_config({"num_nodes": 1, "colective": {}})
        Traceback (most recent call last):
        ...
        p2p_asyncwork._errors.ConfigError: cluster.colective: unknown key; got {}; allowed: keys num_nodes, collective, net_emulation; did you mean 'collective'?
    """  # noqa: E501
    data = load_config_source(source)
    if isinstance(data, Mapping) and "cluster" in data:
        data = data["cluster"]
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError.invalid(path, data, "a mapping of keys to values")
    for key, value in data.items():
        if key not in _KEYS:
            raise ConfigError.unknown_key(path, key, value, _KEYS)
    num_nodes = _parse_num_nodes(data.get("num_nodes"), f"{path}.num_nodes")
    coll_section = data.get("collective")
    coll_path = f"{path}.collective"
    if coll_section is not None and not isinstance(coll_section, Mapping):
        raise ConfigError.invalid(
            coll_path, coll_section, "a mapping of keys to values (or omit the section)"
        )
    collective = parse_collective_config(coll_section, path=coll_path)
    net: NetEmulationConfig | None = None
    net_section = data.get("net_emulation")
    if net_section is not None:
        net_path = f"{path}.net_emulation"
        net = parse_net_emulation(net_section, path=net_path)
        if net is not None:
            collective = dataclasses.replace(collective, net_emulation=net)
    return ClusterConfig(num_nodes=num_nodes, collective=collective, net_emulation=net)


def _parse_num_nodes(value: object, path: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError.invalid(path, value, "an integer >= 1, or null for what is there")
    return value
