from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from p2p_asyncwork import ConfigError, P2PError
from p2p_worker import (
    ClusterConfig,
    ClusterError,
    PlacementError,
    WorkerError,
    parse_cluster_config,
)


def test_defaults_and_num_nodes() -> None:
    cfg = parse_cluster_config(None)
    assert isinstance(cfg, ClusterConfig)
    assert cfg.num_nodes is None
    assert cfg.net_emulation is None
    assert cfg.codec_name is None
    assert parse_cluster_config({"num_nodes": 2}).num_nodes == 2
    assert parse_cluster_config({"cluster": {"num_nodes": 3}, "runner": {"x": 1}}).num_nodes == 3
    assert parse_cluster_config({"cluster": None}).num_nodes is None


def test_yaml_text_and_file(tmp_path: Path) -> None:
    text = "cluster:\n  num_nodes: 1\n"
    assert parse_cluster_config(text).num_nodes == 1
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert parse_cluster_config(path).num_nodes == 1
    assert parse_cluster_config(str(path)).num_nodes == 1
    with pytest.raises(ValueError, match="no such YAML file"):
        parse_cluster_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_cluster_config("cluster: [unclosed\n")
    with pytest.raises(TypeError, match="mapping, a YAML file path or YAML text"):
        parse_cluster_config(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"cluster": {"num_node": 1}}, "cluster.num_node"),
        ({"num_nodes": 0}, "cluster.num_nodes"),
        ({"num_nodes": True}, "cluster.num_nodes"),
        ({"num_nodes": "2"}, "cluster.num_nodes"),
        ({"cluster": [1, 2]}, "cluster"),
        ({"collective": 5}, "cluster.collective"),
    ],
)
def test_errors_name_the_key_path(config: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cluster_config(config)
    assert info.value.path == path
    assert path in str(info.value)


def test_collective_sections_are_delegated() -> None:
    from p2p_collective import CollectiveConfig

    cfg = parse_cluster_config(
        {
            "cluster": {
                "collective": {
                    "tensor_buffer_pool": {"max_bytes": 1 << 20},
                    "tensor_compression": {"enabled": True, "codec": "zstd", "level": 3},
                }
            }
        }
    )
    assert isinstance(cfg.collective, CollectiveConfig)
    assert cfg.codec_name == "zstd"
    assert cfg.collective.buffer_pool.max_bytes == 1 << 20
    with pytest.raises(ConfigError) as info:
        parse_cluster_config(
            {"collective": {"tensor_compression": {"codec": "lz4", "max_inflight": 2}}}
        )
    assert info.value.path.startswith("cluster.collective.tensor_compression")
    with pytest.raises(ConfigError) as info:
        parse_cluster_config({"collective": {"bogus": 1}})
    assert info.value.path == "cluster.collective.bogus"


def test_net_emulation_goes_into_the_collective_config() -> None:
    section = {"bandwidth_mbps": 100.0, "delay_ms": 1.0}
    cfg = parse_cluster_config({"net_emulation": section})
    assert cfg.net_emulation is not None
    assert cfg.collective.net_emulation == cfg.net_emulation
    with pytest.raises(ConfigError) as info:
        parse_cluster_config({"net_emulation": {"bandwidth": 1}})
    assert info.value.path.startswith("cluster.net_emulation")


@pytest.mark.parametrize("cls", [WorkerError, ClusterError, PlacementError])
def test_errors_pickle_with_message_cause_and_fields(cls: type[WorkerError]) -> None:
    err = cls("it broke", group_name="g", rank=3, method="step", remote_traceback="tb")
    err.__cause__ = ValueError("root cause")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert isinstance(back, P2PError)
    assert str(back) == "it broke"
    assert (back.group_name, back.rank, back.method, back.remote_traceback) == (
        "g",
        3,
        "step",
        "tb",
    )
    assert isinstance(back.__cause__, ValueError)
    assert str(back.__cause__) == "root cause"


_STYLE = r"^[\w.\[\]]+: (.+; )?got .+; allowed: .+$"


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"num_nodes": 0}, "cluster.num_nodes"),
        ({"num_nodes": "2"}, "cluster.num_nodes"),
        ({"cluster": [1, 2]}, "cluster"),
        ({"collective": 5}, "cluster.collective"),
        ({"colective": {}}, "cluster.colective"),
        ({"collective": {"op_timeout": float("inf")}}, "cluster.collective.op_timeout"),
        ({"collective": {"tensor_compression": {"codec": "lz5"}}}, None),
        ({"collective": {"tensor_buffer_pool": {"max_bytes": 0}}}, None),
        ({"net_emulation": {"delay_ms": -1}}, "cluster.net_emulation.delay_ms"),
    ],
)
def test_every_layer_words_errors_alike(config: dict[str, object], path: str | None) -> None:
    """Worker, collective and compress sections: '<path>: got X; allowed: ...'."""
    import re

    with pytest.raises(ConfigError) as info:
        parse_cluster_config(config)
    msg = str(info.value)
    assert re.match(_STYLE, msg), msg
    assert "expected" not in msg
    if path is not None:
        assert info.value.path == path
        assert msg.startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("config", "hint"),
    [
        ({"colective": {}}, "collective"),
        ({"num_node": 1}, "num_nodes"),
        ({"net_emulaton": {}}, "net_emulation"),
        ({"collective": {"tensor_compression": {"algorithm": "lz5"}}}, "codec"),
        ({"collective": {"tensor_compression": {"codec": "lz5"}}}, "lz4"),
    ],
)
def test_near_misses_get_did_you_mean(config: dict[str, object], hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cluster_config(config)
    assert str(info.value).endswith(f"; did you mean {hint!r}?")


def test_yaml_infinity_timeout_is_refused_naming_null() -> None:
    with pytest.raises(ConfigError, match=r"op_timeout: got inf; allowed: a finite .* or null"):
        parse_cluster_config("cluster:\n  collective:\n    op_timeout: .inf\n")
