"""Ray's tracing wrapper stays off the internal methods of a class marked untraced."""

from __future__ import annotations

import asyncio
import inspect

from ray.util.tracing.tracing_helper import _inject_tracing_into_class

from p2p_worker import ChannelWorker
from p2p_worker._process._untraced import internal_functions, untraced_internals


@untraced_internals
class _Marked:
    def _helper(self, x: int) -> int:
        return x + 1

    async def _waiter(self, x: int) -> int:
        return x * 2

    def remote_call(self, x: int) -> int:
        return self._helper(x)


def test_ray_wraps_the_remote_methods_and_leaves_the_internal_ones() -> None:
    helper, waiter, remote = _Marked._helper, _Marked._waiter, _Marked.remote_call
    _inject_tracing_into_class(_Marked)  # type: ignore[no-untyped-call]  # what Ray does
    assert _Marked._helper is helper
    assert _Marked._waiter is waiter
    assert inspect.iscoroutinefunction(_Marked._waiter)
    assert _Marked.remote_call is not remote  # wrapped: tracing still sees remote calls
    assert inspect.unwrap(_Marked.remote_call) is remote
    obj = _Marked()
    assert obj.remote_call(1) == 2
    assert asyncio.run(obj._waiter(3)) == 6


def test_the_channel_workers_internal_methods_are_marked() -> None:
    # ChannelWorker and its parts (requests, puts, views), each marked on its own
    parts = [c for c in ChannelWorker.__mro__ if c.__module__.startswith("p2p_worker._channels.")]
    assert len(parts) == 4
    private = [f for part in parts for f in internal_functions(part)]
    assert len(private) > 20
    assert all(getattr(f, "__ray_tracing_wrapped__", False) for f in private)
