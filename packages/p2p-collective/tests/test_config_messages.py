"""cluster.collective and cluster.net_emulation errors: one style, with 'did you mean' hints."""

from __future__ import annotations

import re
from typing import Any

import pytest

from p2p_asyncwork import ConfigError
from p2p_collective import parse_collective_config, parse_net_emulation

STYLE = re.compile(r"^[\w.\[\]]+: (.+; )?got .+; allowed: .+$")


@pytest.mark.parametrize(
    ("section", "path", "hint"),
    [
        ({"op_timout": 3}, "cluster.collective.op_timout", "op_timeout"),
        ({"init_timeouts": 3}, "cluster.collective.init_timeouts", "init_timeout"),
        ({"shared_mem": True}, "cluster.collective.shared_mem", "shared_memory"),
        ({"object_policy": "plane"}, "cluster.collective.object_policy", "plain"),
        (
            {"tensor_compression": {"algorithm": "lz5"}},
            "cluster.collective.tensor_compression.algorithm",
            "codec",
        ),
    ],
)
def test_collective_near_misses_get_a_hint(section: dict[str, Any], path: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_collective_config(section)
    assert info.value.path == path
    msg = str(info.value)
    assert STYLE.match(msg), msg
    assert msg.endswith(f"; did you mean {hint!r}?")


@pytest.mark.parametrize(
    ("section", "path"),
    [
        ({"bandwith_mbps": 100}, "cluster.net_emulation.bandwith_mbps"),
        ({"bandwidth_mbps": -1}, "cluster.net_emulation.bandwidth_mbps"),
        ({"enabled": "yes"}, "cluster.net_emulation.enabled"),
    ],
)
def test_net_emulation_errors_share_the_style(section: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_net_emulation(section, path="cluster.net_emulation")
    assert info.value.path == path
    assert STYLE.match(str(info.value)), str(info.value)
