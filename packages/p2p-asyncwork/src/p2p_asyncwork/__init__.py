"""Awaitable work handles and the root error type of the p2p stack.

Example:
    >>> from p2p_asyncwork import AsyncResultWork
    >>> w = AsyncResultWork()
    >>> w.then(str.upper).then(len)  # doctest: +ELLIPSIS
    <AsyncFuncWork pending>
    >>> w.set_result("abc")
    >>> w.get_last_work().wait()
    3
"""

from p2p_asyncwork._errors import (
    ConfigError,
    P2PError,
    WorkCancelledError,
    WorkError,
    WorkTimeoutError,
)
from p2p_asyncwork._waiting import wait_any
from p2p_asyncwork._work import AsyncFuncWork, AsyncResultWork, AsyncWork
from p2p_asyncwork._wrappers import AsyncChannelWork, AsyncCollWork

__version__ = "0.1.0"

__all__ = [
    "AsyncWork",
    "AsyncResultWork",
    "AsyncFuncWork",
    "AsyncCollWork",
    "AsyncChannelWork",
    "wait_any",
    "P2PError",
    "WorkError",
    "WorkTimeoutError",
    "WorkCancelledError",
    "ConfigError",
    "__version__",
]
