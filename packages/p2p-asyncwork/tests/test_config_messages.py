"""ConfigError.invalid / unknown_key: the one message style of every layer's config errors."""

from __future__ import annotations

import doctest
import pickle

import pytest

import p2p_asyncwork._errors
from p2p_asyncwork import ConfigError


def test_invalid_reads_path_got_allowed() -> None:
    err = ConfigError.invalid("cluster.num_nodes", 0, "an integer >= 1")
    assert str(err) == "cluster.num_nodes: got 0; allowed: an integer >= 1"
    assert err.path == "cluster.num_nodes"
    assert isinstance(err, ValueError)


def test_invalid_with_a_reason_and_a_close_choice() -> None:
    err = ConfigError.invalid(
        "tc.codec", "lz5", "lz4 or zstd", what="not a codec", choices=("lz4", "zstd")
    )
    assert str(err) == "tc.codec: not a codec; got 'lz5'; allowed: lz4 or zstd; did you mean 'lz4'?"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("ZSTD", "; did you mean 'zstd'?"),
        ("gzip", ""),
        (5, ""),
        ("zstd ", "; did you mean 'zstd'?"),
    ],
)
def test_value_hints_only_for_near_misses(value: object, hint: str) -> None:
    err = ConfigError.invalid("p", value, "lz4 or zstd", choices=("lz4", "zstd"))
    assert str(err).endswith(f"allowed: lz4 or zstd{hint}")


def test_unknown_key_names_the_key_path_value_keys_and_hint() -> None:
    err = ConfigError.unknown_key(
        "cluster.collective", "op_timout", 3, ["init_timeout", "op_timeout"]
    )
    assert err.path == "cluster.collective.op_timout"
    assert str(err) == (
        "cluster.collective.op_timout: unknown key; got 3; "
        "allowed: keys init_timeout, op_timeout; did you mean 'op_timeout'?"
    )


def test_unknown_key_alias_hint_when_no_spelling_is_close() -> None:
    keys = ["enabled", "codec"]
    err = ConfigError.unknown_key("tc", "algorithm", "lz5", keys, aliases={"algorithm": "codec"})
    assert str(err).endswith("allowed: keys enabled, codec; did you mean 'codec'?")
    plain = ConfigError.unknown_key("tc", "algorithm", "lz5", keys)
    assert "did you mean" not in str(plain)
    unrelated = ConfigError.unknown_key("tc", "zzz", 1, keys, aliases={"algorithm": "codec"})
    assert "did you mean" not in str(unrelated)


def test_built_errors_pickle() -> None:
    err = ConfigError.unknown_key("a", "b", 1, ["c"])
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.path, type(back)) == (str(err), "a.b", ConfigError)


def test_docstring_examples() -> None:
    result = doctest.testmod(p2p_asyncwork._errors, extraglobs={"ConfigError": ConfigError})
    assert result.attempted >= 2
    assert result.failed == 0
