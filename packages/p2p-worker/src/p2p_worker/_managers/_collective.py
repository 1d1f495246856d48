"""CollectiveManager: RLinf's job-wide registry of collective groups and their master ports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from p2p_worker._info import WorkerInfo
from p2p_worker._managers._manager import Manager


class CollectiveGroupInfo:
    """What a collective group is: its name, members and master address (RLinf's type).

    Args:
        group_name: The group's name.
        workers: The members, each a :class:`~p2p_worker.WorkerInfo`, in rank order.
        master_addr: IP of the member that hosts the group's rendezvous.

    Attributes:
        group_name: As given.
        workers: The members as a list.
        master_addr: As given.
        master_port: The rendezvous port once a member published it, else ``None``.
        world_size: Number of members.

    Raises:
        ValueError: ``group_name`` is empty or a member appears twice.

    Example:
        >>> from p2p_worker import WorkerAddress, WorkerInfo
        >>> a = WorkerInfo(WorkerAddress("g", 0), 0, 0, None, "127.0.0.1")
        >>> b = WorkerInfo(WorkerAddress("g", 1), 1, 0, None, "127.0.0.1")
        >>> CollectiveGroupInfo("g", [a, b], "127.0.0.1").world_size
        2
    """

    def __init__(self, group_name: str, workers: Sequence[WorkerInfo], master_addr: str) -> None:
        if not isinstance(group_name, str) or not group_name:
            raise ValueError(f"group_name: got {group_name!r}; allowed: a non-empty str")
        members = list(workers)
        seen: set[WorkerInfo] = set()
        for w in members:
            if w in seen:
                raise ValueError(
                    f"workers: {w.address.get_name()!r} appears twice in collective group "
                    f"{group_name!r}; allowed: distinct workers"
                )
            seen.add(w)
        self.group_name = group_name
        self.workers = members
        self.master_addr = master_addr
        self.master_port: int | None = None
        self.world_size = len(members)

    def __eq__(self, other: object) -> bool:
        """Same name, members (in order) and master address; the port is not compared."""
        if not isinstance(other, CollectiveGroupInfo):
            return NotImplemented
        return (
            self.group_name == other.group_name
            and self.workers == other.workers
            and self.master_addr == other.master_addr
        )

    __hash__ = None  # type: ignore[assignment]  # mutable (master_port): not hashable

    def __repr__(self) -> str:
        names = [w.address.get_name() for w in self.workers]
        return (
            f"CollectiveGroupInfo({self.group_name!r}, {names}, master={self.master_addr}:"
            f"{self.master_port})"
        )


class CollectiveManager(Manager):
    """Job-wide registry of collective groups (RLinf's ``CollectiveManager``).

    In RLinf the members of a collective group register it here and publish the port
    of their rendezvous. p2p's groups meet through the job's rendezvous store instead
    and never use this manager; it is here, with RLinf's methods, for code that does.
    Reach it from any process of the job with ``CollectiveManager.get_proxy()``.

    Example:
        >>> from p2p_worker import WorkerAddress, WorkerInfo
        >>> manager = CollectiveManager()  # a local one; get_proxy() gives the job's
        >>> w = WorkerInfo(WorkerAddress("g", 0), 0, 0, None, "127.0.0.1")
        >>> manager.register_collective_group(CollectiveGroupInfo("g", [w], "127.0.0.1"))
        >>> manager.set_master_port_info("g", 29500)
        >>> manager.get_master_port_info("g")
        29500
    """

    MANAGER_NAME: ClassVar[str] = "CollectiveManager"

    def __init__(self) -> None:
        self._groups: dict[str, CollectiveGroupInfo] = {}

    def register_collective_group(self, group_info: CollectiveGroupInfo) -> None:
        """Register a group; registering an equal one again is a no-op.

        Args:
            group_info: The group.

        Raises:
            TypeError: ``group_info`` is not a :class:`CollectiveGroupInfo`.
            ValueError: A different group of that name is registered.
        """
        if not isinstance(group_info, CollectiveGroupInfo):
            raise TypeError(
                f"group_info: expected a CollectiveGroupInfo, got {type(group_info).__name__}"
            )
        old = self._groups.get(group_info.group_name)
        if old is not None and old != group_info:
            raise ValueError(
                f"group_info: collective group {group_info.group_name!r} is registered as "
                f"{old!r}; cannot register a different {group_info!r}"
            )
        if old is None:
            self._groups[group_info.group_name] = group_info

    def get_collective_group(self, group_name: str) -> CollectiveGroupInfo | None:
        """The registered group of that name, or ``None``."""
        return self._groups.get(group_name)

    def set_master_port_info(self, group_name: str, master_port: int) -> None:
        """Publish the rendezvous port of a registered group.

        Raises:
            ValueError: No group of that name is registered, or the port is not 1-65535.
        """
        if isinstance(master_port, bool) or not isinstance(master_port, int):
            raise ValueError(f"master_port: got {master_port!r}; allowed: an int in 1..65535")
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port: got {master_port}; allowed: 1..65535")
        self._registered(group_name).master_port = master_port

    def get_master_port_info(self, group_name: str) -> int | None:
        """The published port of a group, or ``None`` (unknown group or no port yet)."""
        info = self._groups.get(group_name)
        return None if info is None else info.master_port

    def reset_master_port_info(self, group_name: str) -> None:
        """Forget the published port of a registered group.

        Raises:
            ValueError: No group of that name is registered.
        """
        self._registered(group_name).master_port = None

    def _registered(self, group_name: str) -> CollectiveGroupInfo:
        info = self._groups.get(group_name)
        if info is None:
            raise ValueError(
                f"group_name: no collective group {group_name!r} is registered; registered: "
                f"{sorted(self._groups)}"
            )
        return info
