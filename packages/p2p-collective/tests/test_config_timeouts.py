"""init_timeout / op_timeout: null means no limit and works end to end; infinity is refused."""

from __future__ import annotations

import math

import pytest
import timeout_tasks

from p2p_asyncwork import ConfigError
from p2p_collective import CollectiveConfig, parse_collective_config


@pytest.mark.parametrize("key", ["init_timeout", "op_timeout"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_timeouts_are_refused_naming_null(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as info:
        parse_collective_config({key: value})
    msg = str(info.value)
    assert msg.startswith(f"cluster.collective.{key}: got {value!r}; allowed: ")
    assert "finite" in msg
    assert "null for no limit" in msg
    with pytest.raises(ConfigError, match=key):
        CollectiveConfig(**{key: value})


def test_null_timeouts_parse_to_none() -> None:
    cfg = parse_collective_config({"init_timeout": None, "op_timeout": None})
    assert (cfg.init_timeout, cfg.op_timeout) == (None, None)
    assert parse_collective_config(cfg.to_dict()) == cfg


@pytest.mark.timeout(120)
def test_no_timeouts_at_all_still_transfers(peers, gname: str) -> None:  # type: ignore[no-untyped-def]
    a, b = peers.run(
        timeout_tasks.t_no_timeouts, (gname,), timeout_tasks.t_no_timeouts, (gname,), timeout=90
    )
    expected = sum(range(1 << 16))
    assert a == [None, 2 * expected, {"step": 1}]
    assert b == [None, expected, {"step": 0}]
