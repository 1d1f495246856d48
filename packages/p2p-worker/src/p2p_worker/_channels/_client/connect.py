"""Finding a channel's worker through Ray and connecting a process's link to it."""

from __future__ import annotations

import time
from typing import cast

import ray

from p2p_worker._address import WorkerAddress
from p2p_worker._channels._client.link import ChannelLink
from p2p_worker._channels._protocol.actor import ChannelActor
from p2p_worker._channels._protocol.errors import ChannelClosedError, ChannelNotFoundError
from p2p_worker._channels._protocol.proto import CHANNEL_NAMESPACE, actor_name
from p2p_worker._runtime._state import JobContext, WorkerRuntime

_LOOKUP_PAUSE = 0.1  # seconds between lookups of a channel not created yet


def lookup_actor(job: JobContext, name: str, timeout: float | None) -> ChannelActor:
    """Find the channel worker of ``name`` in the job, polling until ``timeout``.

    Raises:
        ChannelNotFoundError: No such channel appeared within ``timeout``.
    """
    full = actor_name(job.store_host, job.store_port, name)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return cast("ChannelActor", ray.get_actor(full, namespace=CHANNEL_NAMESPACE))
        except ValueError as exc:
            launched = _launched_actor(name)
            if launched is not None:
                return launched
            if deadline is not None and time.monotonic() >= deadline:
                raise ChannelNotFoundError(
                    f"no channel named {name!r} in this job (waited {timeout} s); create it "
                    f"with create_channel({name!r}) first"
                ) from exc
        time.sleep(_LOOKUP_PAUSE)


def _launched_actor(name: str) -> ChannelActor | None:
    """Rank 0 of a ChannelWorker group launched under ``name`` (RLinf's way), or None."""
    try:
        actor = ray.get_actor(WorkerAddress(name, (0,)).get_name())
        actor.hello  # noqa: B018 - a handle of another worker class has no such method
    except (ValueError, AttributeError):
        return None
    return cast("ChannelActor", actor)


def connect_link(endpoint: WorkerRuntime, name: str, timeout: float | None) -> ChannelLink:
    """Find channel ``name``, say hello, and connect this process's link to it.

    Raises:
        ChannelNotFoundError: No such channel within ``timeout``.
        ChannelClosedError: The channel worker died or did not answer.
        ChannelError: The payload link could not be connected.
    """
    actor = lookup_actor(endpoint.job, name, timeout)
    try:
        hello = ray.get(actor.hello.remote(endpoint.address.get_name()), timeout=timeout)
    except ray.exceptions.GetTimeoutError as exc:
        raise ChannelClosedError(
            f"channel {name!r}: its channel worker did not answer within {timeout} s"
        ) from exc
    except ray.exceptions.RayError as exc:
        raise ChannelClosedError(f"channel {name!r}: its channel worker is gone ({exc})") from exc
    link = ChannelLink(endpoint, actor, hello)
    link.open(hello.transfer_timeout)
    return link
