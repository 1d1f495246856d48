"""The liveness oracle a worker's ``Collective`` asks while it waits for a peer.

p2p-collective sees a peer die through the connections it has to it; a peer it never
connected to it cannot see. Ray can: every worker is a named actor (its address name).
``Collective(is_alive=actor_alive)`` asks this while an operation waits for a peer to
join, about once a second, so an operation toward a worker whose actor is dead fails with
``PeerError`` within seconds instead of at the rendezvous timeout.
"""

from __future__ import annotations

from typing import Protocol, cast

import ray

from p2p_worker._remote import RemoteMethod


class _Pingable(Protocol):
    """An actor handle, as far as the liveness probe calls it."""

    @property
    def __ray_ready__(self) -> RemoteMethod[[], bool]: ...


_READY_WAIT = 0.2  # seconds to wait for the actor's ready probe before answering "alive"


def actor_alive(name: str) -> bool:
    """False only when Ray says the actor named ``name`` is dead.

    An unknown name (the driver's channel endpoint, a group not launched yet) and an
    actor too busy to answer within :data:`_READY_WAIT` count as alive: waiting goes on.
    A dead actor is found either way Ray reports it: still under its name, whose ready
    probe then fails with ``ActorDiedError``, or released from the name (``ray.kill``)
    and listed as ``DEAD`` in the job's actor table.

    Example:
        >>> actor_alive("trainer:0")  # doctest: +SKIP
        True
    """
    try:
        handle = cast("_Pingable", ray.get_actor(name))
    except ValueError:
        return not _dead_in_table(name)
    probe = handle.__ray_ready__.remote()
    done, _ = ray.wait([probe], timeout=_READY_WAIT)
    if not done:
        return True
    try:
        ray.get(probe)
    except ray.exceptions.ActorDiedError:
        return False
    except ray.exceptions.RayError:
        return True  # restarting or unreachable for now: cannot tell
    return True


def _dead_in_table(name: str) -> bool:
    """Whether this job's actor table lists an actor named ``name`` as DEAD.

    ``ray._private.state`` is private; it is used because the public state API
    (``ray.util.state``) needs the dashboard, which p2p-worker's clusters run without.
    A failure of it counts as "not listed" (the caller then waits on).
    """
    try:
        from ray._private import state

        job = ray.get_runtime_context().get_job_id()
        table = state.actors(job_id=ray.JobID.from_hex(job), actor_state_name="DEAD")
        return any(entry.get("Name") == name for entry in table.values())
    except Exception:
        return False


def actor_id_alive(actor_id: str) -> bool:
    """False only when Ray's actor table lists the actor with this hex id as DEAD.

    For actors without a name (plain ``@ray.remote`` actors in a
    :mod:`p2p_worker.compat` group). An unknown id or a failed look-up counts as alive.
    Uses ``ray._private.state`` for the reason given in :func:`_dead_in_table`.

    Example:
        >>> actor_id_alive(ray.get_runtime_context().get_actor_id())  # doctest: +SKIP
        True
    """
    try:
        from ray._private import state

        info = state.actors(actor_id=actor_id)
        return not (isinstance(info, dict) and info.get("State") == "DEAD")
    except Exception:
        return True
