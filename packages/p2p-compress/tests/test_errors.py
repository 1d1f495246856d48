from __future__ import annotations

import pickle

import pytest

from p2p_asyncwork import ConfigError, P2PError
from p2p_compress import CompressionError, CompressionTimeoutError, parse_tensor_compression


def test_hierarchy() -> None:
    assert issubclass(CompressionError, P2PError)
    assert issubclass(CompressionTimeoutError, CompressionError)
    assert issubclass(CompressionTimeoutError, TimeoutError)


@pytest.mark.parametrize("cls", [CompressionError, CompressionTimeoutError])
def test_errors_pickle_with_message_and_cause(cls: type[CompressionError]) -> None:
    try:
        try:
            raise OSError("inner failure")
        except OSError as inner:
            raise cls("outer message") from inner
    except cls as exc:
        err = exc
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == "outer message"
    assert isinstance(back.__cause__, OSError)
    assert str(back.__cause__) == "inner failure"


def test_config_error_pickles_with_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_tensor_compression({"codec": "zstd", "level": 0}, "cluster.collective.tc")
    back = pickle.loads(pickle.dumps(info.value))
    assert back.path == "cluster.collective.tc.level"
    assert str(back) == str(info.value)
