from __future__ import annotations

import pickle

import pytest

from p2p_asyncwork import (
    ConfigError,
    P2PError,
    WorkCancelledError,
    WorkError,
    WorkTimeoutError,
)


@pytest.mark.parametrize(
    "cls", [P2PError, WorkError, WorkTimeoutError, WorkCancelledError, ConfigError]
)
def test_errors_pickle_with_message_and_cause(cls: type[P2PError]) -> None:
    try:
        try:
            raise ConnectionResetError("socket closed by peer")
        except ConnectionResetError as cause:
            raise cls("operation failed: details here") from cause
    except P2PError as err:
        restored = pickle.loads(pickle.dumps(err))
    assert type(restored) is cls
    assert str(restored) == "operation failed: details here"
    assert isinstance(restored.__cause__, ConnectionResetError)
    assert str(restored.__cause__) == "socket closed by peer"


def test_builtin_bases() -> None:
    assert issubclass(WorkTimeoutError, TimeoutError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, P2PError)


def test_config_error_keeps_path_through_pickle() -> None:
    err = ConfigError("cluster.x: unknown key", path="cluster.x")
    restored = pickle.loads(pickle.dumps(err))
    assert restored.path == "cluster.x"
    assert str(restored) == "cluster.x: unknown key"


class _MixedBaseError(P2PError, RuntimeError):
    pass


class _MixedTimeoutError(_MixedBaseError, TimeoutError):
    """Two builtin bases with different layouts (RuntimeError, TimeoutError/OSError)."""


def test_error_with_two_builtin_bases_pickles_with_message_and_cause() -> None:
    try:
        try:
            raise ValueError("root")
        except ValueError as root:
            raise _MixedTimeoutError("slow peer") from root
    except _MixedTimeoutError as exc:
        back = pickle.loads(pickle.dumps(exc))
    assert type(back) is _MixedTimeoutError
    assert str(back) == "slow peer"
    assert isinstance(back.__cause__, ValueError)
    assert str(back.__cause__) == "root"
    assert isinstance(back, RuntimeError)
    assert isinstance(back, TimeoutError)
