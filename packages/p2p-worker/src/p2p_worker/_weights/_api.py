"""``Worker.push_weights`` / ``Worker.pull_weights``: weight sync in one call per side."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeAlias, cast

from p2p_asyncwork import AsyncWork
from p2p_collective import Collective
from p2p_worker._address import WorkerAddress, member_address, parse_group_name
from p2p_worker._errors import WorkerError
from p2p_worker._weights._edges import remaining
from p2p_worker._weights._report import PushReport
from p2p_worker._weights._shards import ShardedReceiver
from p2p_worker._weights._source import DEFAULT_JOIN_TIMEOUT, DEFAULT_PUSH_TIMEOUT, WeightSender
from p2p_worker._weights._target import DEFAULT_PULL_TIMEOUT, WeightReceiver

if TYPE_CHECKING:
    import torch
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from p2p_worker._info import WorkerInfo
    from p2p_worker._runtime._state import WorkerRuntime

SIZE_KEY = "p2p/worker-group-size/{}"  # the key create_collective publishes sizes under

Model: TypeAlias = "torch.nn.Module | Mapping[str, torch.Tensor]"
"""What weight sync reads or writes: a module (parameters, persistent buffers) or tensors."""
TargetItem: TypeAlias = "str | WorkerAddress | tuple[str, int | list[int]]"
"""One target of a push: a group name, an address (or its string), ``(group, ranks)``."""
_Syncs: TypeAlias = "dict[tuple[str, str], WeightSender | WeightReceiver | ShardedReceiver]"


def _sync_name(sync: object) -> str:
    if (
        not isinstance(sync, str)
        or not sync
        or not sync.replace("_", "").replace("-", "").isalnum()
    ):
        raise ValueError(f"sync: got {sync!r}; allowed: a non-empty name of letters, digits, _ -")
    return sync


class WeightSyncMixin:
    """Weight sync for :class:`~p2p_worker.Worker` (mixed in)."""

    _world_size: int

    if TYPE_CHECKING:  # provided by Worker

        @property
        def collective(self) -> Collective: ...

        @property
        def worker_address(self) -> WorkerAddress: ...

        @property
        def worker_info(self) -> WorkerInfo: ...

        def _p2p_worker_runtime(self) -> WorkerRuntime: ...

    def _p2p_weight_syncs(self) -> _Syncs:
        found: _Syncs = self.__dict__.setdefault("_p2p_weights", {})
        return found

    def _p2p_publish_size(self) -> None:
        own = self.worker_address.get_parent_address()
        assert own is not None  # a worker's address has at least one rank
        self._p2p_worker_runtime().store().set(
            SIZE_KEY.format(own.get_name()), str(self._world_size)
        )

    def push_weights(
        self,
        model: Model,
        version: int,
        targets: TargetItem | list[TargetItem] | None = None,
        *,
        sync: str = "weights",
        async_op: bool = False,
        timeout: float | None = DEFAULT_PUSH_TIMEOUT,
        join_timeout: float | None = DEFAULT_JOIN_TIMEOUT,
        bucket_bytes: int | None = None,
        fanout: int | None = None,
        delta: bool | None = None,
        partial: bool | None = None,
        compress_full: bool | None = None,
    ) -> PushReport | AsyncWork[PushReport]:
        """Push ``model`` as ``version`` to every target of the sync, in one call.

        Every target calls :meth:`pull_weights` with this worker as its source. The
        targets say what they hold; the source plans a relay (a chain, or a tree with
        ``fanout`` children per target, ordered by node) so that it sends each byte
        once, and targets on one node share it: they read full buckets from the shared
        memory of the source or of their node's first target; buckets of ``bucket_bytes`` are cast to each target's dtype, checksummed
        and sent as they are ready, unchanged ones not at all, changed ones as a
        bit-level delta where that is smaller (once p2p-compress offers one), in full to
        a target that is new, behind or torn. Do not change ``model`` until the push
        returns (or its handle completes).

        Args:
            model: An ``nn.Module`` (parameters and persistent buffers; frozen parameters
                are not looked at again once every target holds them) or a dict of
                tensors; fp32 masters are fine, each target's dtypes decide.
            version: The version number the targets will report.
            targets: Who receives: a group name (all its workers), ``(group_name,
                ranks)``, a ``WorkerAddress`` or address string, or a list of those.
                Needed on the first push of a sync; later pushes reuse it.
            sync: Name of this sync (several may run side by side).
            async_op: Return an ``AsyncWork[PushReport]`` at once.
            timeout: Seconds for the whole push.
            join_timeout: Seconds to wait for every target's hello (a target that does
                not pull in time is left out and reported).
            bucket_bytes: Bucket size (default: chosen per push, so the relay pipelines
                the model: about 1/32 of it, at least 512 KiB, when some target is on
                another node and ``delta`` is off; about 1/4, at least 2 MiB, when it is
                on; about 1/16, at least 2 MiB, when all are on this one;
                about 1/4, at least 2 MiB, when all read this worker's shared arena; at
                most 32 MiB); kept.
            fanout: Children per target in the relay (default 1, a chain); kept.
            delta: Keep a delta base, one copy of the model in the targets' dtypes
                (default True); kept.
            partial: This worker is one shard of a sharded trainer: it sends the
                targets' keys it holds, the other shards the rest (default False:
                every key of the targets must be in ``model``); kept. The targets pull
                with ``src_rank`` listing every shard.
            compress_full: Send a bucket that goes in full over a connection packed,
                compressed without loss (byte planes, then zstd level 1: bf16 weights
                take about 2/3 of their bytes), at about 0.75 GB/s per preparing
                thread on the source and 1.3 GB/s on each target (default False);
                kept. It pays where the links are slower than that and the nodes have
                cores to spare; targets reading a shared arena get the plain bits; a
                bucket whose packed form does not save 1/8 of its bytes goes plain.

        Returns:
            A :class:`PushReport` (or a handle to it).

        Raises:
            TypeError, ValueError: Bad arguments, or the model lacks a target's key or
                has another shape for it (the targets are told; nothing is sent).
            WeightSyncError: Some target did not confirm ``version``; ``failed`` names
                each and why, ``report`` tells who holds what.
            WorkerError: This worker was not launched in a group.

        Example:
            >>> report = self.push_weights(self.model, version=step, targets="rollout")  # doctest: +SKIP
            >>> report.targets  # doctest: +SKIP
            {'rollout:0': 7, 'rollout:1': 7}
        """  # noqa: E501
        name = _sync_name(sync)
        syncs = self._p2p_weight_syncs()
        sender = cast("WeightSender | None", syncs.get(("push", name)))
        if targets is not None or sender is None:
            if targets is None:
                raise ValueError(f"targets: the first push of sync {name!r} must name its targets")
            spec = _target_spec(targets, self.worker_address)
            store = self._p2p_worker_runtime().store()

            def resolve(
                deadline: float | None,
                spec: list[str | WorkerAddress] = spec,
                store: TCPStore = store,
            ) -> list[str]:
                return _resolve(spec, store, deadline)

            if sender is None:
                sender = WeightSender(
                    self.collective,
                    self.worker_address.get_name(),
                    resolve,
                    name,
                    node=self.worker_info.node_id,
                )
                syncs[("push", name)] = sender
            else:
                sender._targets = resolve
        sender.configure(
            bucket_bytes=bucket_bytes,
            fanout=fanout,
            delta=delta,
            partial=partial,
            compress_full=compress_full,
        )
        result: PushReport | AsyncWork[PushReport] = sender.push(
            model, version, async_op=async_op, timeout=timeout, join_timeout=join_timeout
        )
        return result

    def pull_weights(
        self,
        model: Model,
        src_group_name: str,
        src_rank: int | list[int] = 0,
        *,
        sync: str = "weights",
        async_op: bool = False,
        timeout: float | None = DEFAULT_PULL_TIMEOUT,
    ) -> int | AsyncWork[int]:
        """Receive the next version pushed by worker ``src_rank`` of ``src_group_name``.

        Writes into ``model``'s own tensors, in place, in their own dtypes and key
        order; forwards each bucket to this worker's successors in the relay as soon as
        it has it; checks every bucket against the source's checksum after applying it.

        Args:
            model: An ``nn.Module`` or a dict of contiguous tensors.
            src_group_name: The source's group name.
            src_rank: The source's rank, or a list of ranks: the shards of a sharded
                source (each pushing with ``partial=True``), pulled in parallel; their
                union must fill every key exactly once.
            sync: Name of the sync (as the source's).
            async_op: Return an ``AsyncWork[int]`` at once.
            timeout: Seconds for the whole pull, waiting for the push included.

        Returns:
            The version now held bit-exactly (or a handle to it).

        Raises:
            TypeError, ValueError: Bad arguments (nothing sent).
            WeightSyncError: The pull failed (checksum mismatch, a dead source, a
                timeout); it names this worker and the version and says whether this
                worker is now torn (``weight_version(...)`` is then None until the next
                push repairs it).
            WorkerError: This worker was not launched in a group.

        Example:
            >>> version = self.pull_weights(self.model, "trainer", 0)  # doctest: +SKIP
        """
        name = _sync_name(sync)
        ranks = src_rank if isinstance(src_rank, list) else [src_rank]
        if not ranks:
            raise ValueError("src_rank: got an empty list; allowed: a rank or a list of ranks")
        sources = [member_address(src_group_name, r, "src_group_name", "src_rank") for r in ranks]
        for source in sources:
            if source == self.worker_address:
                raise ValueError(f"src_group_name, src_rank: {source} is this worker itself")
        wanted = tuple(s.get_name() for s in sources)
        syncs = self._p2p_weight_syncs()
        receiver = cast("WeightReceiver | ShardedReceiver | None", syncs.get(("pull", name)))
        held = () if receiver is None else receiver.source
        if receiver is None or wanted != (held if isinstance(held, tuple) else (held,)):
            self._p2p_publish_size()
            parts = [
                WeightReceiver(
                    self.collective,
                    self.worker_address.get_name(),
                    self.worker_info.node_id,
                    source,
                    name,
                )
                for source in wanted
            ]
            receiver = parts[0] if isinstance(src_rank, int) else ShardedReceiver(parts)
            syncs[("pull", name)] = receiver
        result: int | AsyncWork[int] = receiver.pull(model, async_op=async_op, timeout=timeout)
        return result

    def weight_sender(self, sync: str = "weights") -> WeightSender | None:
        """This worker's :class:`WeightSender` of sync ``sync`` (None before its first push).

        Example:
            >>> self.weight_sender().base_bytes  # doctest: +SKIP
            1048576
        """
        found = self._p2p_weight_syncs().get(("push", _sync_name(sync)))
        return cast("WeightSender | None", found)

    def weight_receiver(self, sync: str = "weights") -> WeightReceiver | ShardedReceiver | None:
        """This worker's :class:`WeightReceiver` of sync ``sync`` (None before its first pull).

        A worker pulling from a sharded source gets a ``ShardedReceiver`` over one
        receiver per shard.

        Its ``progress`` tells how many buckets the running pull has applied.

        Example:
            >>> self.weight_receiver().progress  # doctest: +SKIP
            (12, 40)
        """
        found = self._p2p_weight_syncs().get(("pull", _sync_name(sync)))
        return cast("WeightReceiver | ShardedReceiver | None", found)

    def weight_version(self, sync: str = "weights") -> int | None:
        """The version of sync ``sync`` this worker holds bit-exactly (None: none, or torn).

        Example:
            >>> self.weight_version()  # doctest: +SKIP
            7
        """
        receiver = self._p2p_weight_syncs().get(("pull", _sync_name(sync)))
        return (
            None if receiver is None else cast("WeightReceiver | ShardedReceiver", receiver).version
        )


def _target_spec(spec: object, me: WorkerAddress) -> list[str | WorkerAddress]:
    """Check a targets spec; return its items (group names as addresses, workers as names)."""
    items = list(spec) if isinstance(spec, list) else [spec]
    if not items:
        raise ValueError(
            "targets: got an empty list; allowed: group names, (name, ranks), addresses"
        )
    out: list[str | WorkerAddress] = []
    for i, item in enumerate(items):
        if isinstance(item, WorkerAddress):
            out.append(item.get_name())
        elif isinstance(item, str) and ":" in item:
            out.append(WorkerAddress.from_name(item).get_name())
        elif isinstance(item, str):
            out.append(parse_group_name(item, f"targets[{i}]"))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            ranks = item[1] if isinstance(item[1], list) else [item[1]]
            out += [
                member_address(item[0], r, f"targets[{i}]", f"targets[{i}] ranks").get_name()
                for r in ranks
            ]
        else:
            raise TypeError(
                f"targets[{i}]: got {item!r}; allowed: a group name, (group_name, ranks), a"
                " WorkerAddress or an address string"
            )
    names = [o for o in out if isinstance(o, str)]
    if me.get_name() in names:
        raise ValueError(f"targets: {me} is the source itself")
    return out


def _resolve(spec: list[str | WorkerAddress], store: TCPStore, deadline: float | None) -> list[str]:
    """Target names; whole groups' sizes come from the store (their workers publish them)."""
    out: list[str] = []
    for item in spec:
        if isinstance(item, str):
            out.append(item)
            continue
        key = SIZE_KEY.format(item.get_name())
        left = remaining(deadline)
        try:
            store.wait(
                [key], datetime.timedelta(seconds=60.0 if left is None else max(left, 0.001))
            )
            size = int(bytes(store.get(key)).decode())
        except Exception as exc:
            raise WorkerError(
                f"targets: the size of group {item.get_name()!r} is unknown (none of its workers"
                " has pulled yet); name its workers as (group_name, ranks)"
            ) from exc
        out += [item.get_child_address(r).get_name() for r in range(size)]
    seen: set[str] = set()
    return [n for n in out if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]
