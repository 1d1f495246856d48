"""A rollout worker lost on the way (``p2p-bench rl --kill-rollout STEP``), on p2p.

During step ``STEP`` the driver kills the last rollout worker's process (``SIGKILL``
where it runs on the driver's node, ``ray.kill`` elsewhere) right after starting the
step. Nothing in the loop is told: the driver learns of the death the way it would of
a crash, from that worker's step call failing (its actor died). It then:

1. launches a replacement, alone in a group of its own, that plays the dead worker's
   slot (its seeds, its trainer key) and connects to the channel;
2. has trainer 0 hand the replacement the weights it holds now, in full, on a sync of
   their own (``push_weights(..., sync="catchup")`` / ``pull_weights(...,
   sync="catchup")``): version ``STEP - 1`` while the step still waits for the lost
   rollouts, ``STEP`` if the trainers already finished it;
3. tells trainer 0 its new weight targets (the surviving workers and the replacement),
   which its next push uses: a push never waits for the dead worker;
4. if the replacement holds version ``STEP - 1``, runs its step ``STEP``: it samples the
   dead worker's sequences again, from the same weights and seeds (the same sequences,
   the same rollout ids), puts them, and pulls version ``STEP`` with the others.

Whether the dead worker's own item reached the channel before it died is not known;
the trainers keep the first copy of each ``(step, rank)`` and drop the other
(:mod:`p2p_worker.bench._rl_ledger`). A push already under way when the worker died
reports it as a failed target; the driver accepts that for dead workers only.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import ray

from p2p_worker import GroupCallHandle, Worker, WorkerError, WorkerGroup
from p2p_worker.bench._rl_records import Event, VersionResult

W = TypeVar("W", bound=Worker)
"""The rollout workers' class."""
T = TypeVar("T", bound=Worker)
"""The trainers' class."""

Launch = Callable[[int, str], WorkerGroup[W]]
"""``launch(slot, name)``: a started replacement rollout worker for ``slot``, group ``name``."""


def died(exc: BaseException) -> bool:
    """Whether a group call failed because its worker's process died (not by raising)."""
    return isinstance(exc, WorkerError) and isinstance(exc.__cause__, ray.exceptions.RayActorError)


def kill(group: WorkerGroup[W], rank: int, step: int) -> Event:
    """Kill worker ``rank`` of ``group`` at once; return the event for the report."""
    info = group.worker_infos[rank]
    here = ray.get_runtime_context().get_node_id()
    if info.pid and info.ray_node_id == here:
        os.kill(info.pid, signal.SIGKILL)
        how = "SIGKILL"
    else:
        ray.kill(group.actors[rank], no_restart=True)
        how = "ray.kill"
    event: Event = {
        "event": "killed",
        "step": step,
        "slot": rank,
        "worker": info.address.get_name(),
        "pid": info.pid,
        "how": how,
        "at": time.time(),
    }
    return event


class Members(Generic[W]):
    """Who plays each rollout slot: a rank of the rollout group, or a replacement's group.

    Args:
        rollouts: The rollout group (slot ``r`` is its rank ``r`` until replaced).
    """

    def __init__(self, rollouts: WorkerGroup[W]) -> None:
        self.base = rollouts
        self.slots: dict[int, tuple[WorkerGroup[W], int]] = {
            r: (rollouts, r) for r in range(rollouts.world_size)
        }
        self.replacements: list[WorkerGroup[W]] = []
        self.dead: set[str] = set()

    def call(self, slot: int, method: str, *args: object) -> GroupCallHandle:
        """Call ``method`` on the worker of ``slot`` alone."""
        group, rank = self.slots[slot]
        return group.execute_on(rank).call(method, *args)

    def address(self, slot: int) -> str:
        """The address name of the worker playing ``slot``."""
        group, rank = self.slots[slot]
        return f"{group.name}:{rank}"

    def targets(self) -> list[tuple[str, list[int]]]:
        """The weight targets: ``(group, ranks)`` of every worker playing a slot."""
        out: dict[str, list[int]] = {}
        for group, rank in self.slots.values():
            out.setdefault(group.name, []).append(rank)
        return [(name, sorted(ranks)) for name, ranks in out.items()]

    def replace(
        self,
        slot: int,
        step: int,
        launch: Launch[W],
        trainers: WorkerGroup[T],
        timeout: float,
    ) -> tuple[GroupCallHandle | None, Event]:
        """Put a replacement in ``slot``'s place during ``step`` (see the module's docstring).

        Returns:
            The replacement's call of ``step`` (None when the trainers had already
            finished the step: nothing of it is left to sample), and the event.

        Raises:
            WorkerError: The replacement did not start, or a call on it or on trainer 0
                failed (each waits at most ``timeout`` seconds).
            RuntimeError: Trainer 0 held a version neither ``step - 1`` nor ``step``.
        """
        noticed = time.time()
        self.dead.add(self.address(slot))
        name = f"{self.base.name}_r{len(self.replacements) + 1}"
        group = launch(slot, name)
        self.replacements.append(group)
        self.slots[slot] = (group, 0)
        group.call("prepare", False).wait(timeout=timeout)
        started = time.time()
        joining = group.call("join")
        catching = trainers.execute_on(0).call("catch_up", [(name, [0])])
        joined: VersionResult = joining.wait(timeout=timeout)[0]
        caught: VersionResult = catching.wait(timeout=timeout)[0]
        trainers.execute_on(0).call("set_targets", self.targets()).wait(timeout=timeout)
        version = int(joined["version"])
        if version not in (step - 1, step):
            raise RuntimeError(f"replacement {name}: trainer 0 held version {version} in {step}")
        handle = group.call("step", step) if version == step - 1 else None
        event: Event = {
            "event": "replaced",
            "step": step,
            "slot": slot,
            "worker": f"{name}:0",
            "noticed": noticed,
            "launch_s": started - noticed,
            "catch_up_s": time.time() - started,
            "joined_version": version,
            "resampled": handle is not None,
            "spans": [*joined["spans"], *caught["spans"]],
        }
        return handle, event
