"""The reductions of a :class:`MultiCollectiveGroup`: allreduce, reduce, reduce_scatter (a mixin).

Each checks its arguments in the calling thread, then queues one operation that reduces
over the group's gloo process group (``reduce_scatter`` of large tensors runs as a ring of
point-to-point messages, see :mod:`._ring`), or over its shared-memory pairs when all
members are on one node (see :mod:`._multi_shm`). The group, its other collectives and its life
are in ``_multi.py``; connecting and queueing in ``_multi_connect.py``.

``async_op=True`` given as a keyword types the result as the work handle; given
positionally, as the union of both results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, overload

import numpy as np
import numpy.typing as npt
import torch

from p2p_asyncwork import AsyncResultWork
from p2p_collective._groups._arrays import ArrayT, as_tensor
from p2p_collective._groups._multi_connect import MultiConnection
from p2p_collective._groups._multi_ops import check_reducible, reduce_op
from p2p_collective._groups._ring import ring_op, ring_reduce_scatter

if TYPE_CHECKING:
    from p2p_collective._groups._multi_ops import ReduceOpLike
    from p2p_collective._links._torch_gloo import GlooGroup

RING_MIN_BYTES = 256 << 10
"""``reduce_scatter`` outputs from this size on run as a ring (see :mod:`._ring`)."""


class MultiReductions(MultiConnection):
    """The reductions of a :class:`MultiCollectiveGroup` (every member calls each, in order).

    A mixin without state of its own: :class:`MultiCollectiveGroup`'s ``__init__`` sets
    every attribute :class:`MultiConnection` declares.
    """

    @overload
    def allreduce(
        self,
        tensor: ArrayT,
        op: ReduceOpLike = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT: ...
    @overload
    def allreduce(
        self,
        tensor: ArrayT,
        op: ReduceOpLike = ...,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[ArrayT]: ...
    @overload
    def allreduce(
        self,
        tensor: ArrayT,
        op: ReduceOpLike = ...,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT | AsyncResultWork[ArrayT]: ...

    def allreduce(
        self,
        tensor: ArrayT,
        op: ReduceOpLike = "sum",
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ArrayT | AsyncResultWork[ArrayT]:
        """Reduce ``tensor`` over all members with ``op``; every member gets the result in place.

        Args:
            tensor: CPU tensor or numpy array, same shape and dtype on every member.
            op: ``"sum"``, ``"product"``, ``"min"`` or ``"max"``.
            async_op: Return an AsyncWork (result: ``tensor``) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            ``tensor`` (holding the result), or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.

        Example:
            >>> group.allreduce(grad, op="sum")  # doctest: +SKIP
        """
        red = reduce_op(op)
        t = as_tensor(tensor, "tensor", "allreduce", writable=True)
        check_reducible(t, "tensor", "allreduce")

        def run(pg: GlooGroup, dl: float | None) -> ArrayT:
            if not self._shm.allreduce(t, red, dl):
                opts = self._opts("AllreduceOptions", dl, red)
                self._wait([pg.allreduce([t], opts)], "allreduce", dl)
            return tensor

        return self._submit("allreduce", run, timeout, async_op)

    @overload
    def reduce(
        self,
        tensor: ArrayT,
        dst: int = ...,
        op: ReduceOpLike = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT: ...
    @overload
    def reduce(
        self,
        tensor: ArrayT,
        dst: int = ...,
        op: ReduceOpLike = ...,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[ArrayT]: ...
    @overload
    def reduce(
        self,
        tensor: ArrayT,
        dst: int = ...,
        op: ReduceOpLike = ...,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT | AsyncResultWork[ArrayT]: ...

    def reduce(
        self,
        tensor: ArrayT,
        dst: int = 0,
        op: ReduceOpLike = "sum",
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ArrayT | AsyncResultWork[ArrayT]:
        """Reduce ``tensor`` over all members into ``tensor`` of member ``dst`` (in place).

        The other members' tensors are left unchanged.

        Returns:
            ``tensor``, or an AsyncWork. Raises as :meth:`allreduce`.
        """
        dst = self._check_rank(dst, "dst")
        red = reduce_op(op)
        t = as_tensor(tensor, "tensor", "reduce", writable=self.rank == dst)
        check_reducible(t, "tensor", "reduce")

        def run(pg: GlooGroup, dl: float | None) -> ArrayT:
            if self._shm.reduce(t, dst, red, dl):
                return tensor
            if self.rank == dst:
                buf = t
            else:  # gloo overwrites a non-root input: reduce a copy in a kept buffer
                buf = self._scratch(t.dtype, t.numel()).view(t.shape)
                buf.copy_(t)
            opts = self._opts("ReduceOptions", dl, red, dst)
            self._wait([pg.reduce([buf], opts)], "reduce", dl)
            return tensor

        return self._submit(f"reduce(dst={dst})", run, timeout, async_op)

    @overload
    def reduce_scatter(
        self,
        output: ArrayT,
        inputs: Sequence[torch.Tensor | npt.NDArray[np.generic]],
        op: ReduceOpLike = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT: ...
    @overload
    def reduce_scatter(
        self,
        output: ArrayT,
        inputs: Sequence[torch.Tensor | npt.NDArray[np.generic]],
        op: ReduceOpLike = ...,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[ArrayT]: ...
    @overload
    def reduce_scatter(
        self,
        output: ArrayT,
        inputs: Sequence[torch.Tensor | npt.NDArray[np.generic]],
        op: ReduceOpLike = ...,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT | AsyncResultWork[ArrayT]: ...

    def reduce_scatter(
        self,
        output: ArrayT,
        inputs: Sequence[torch.Tensor | npt.NDArray[np.generic]],
        op: ReduceOpLike = "sum",
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ArrayT | AsyncResultWork[ArrayT]:
        """Reduce ``inputs[r]`` over all members into ``output`` of member ``r``.

        Args:
            output: This member's result tensor/array (written in place).
            inputs: ``world_size`` tensors/arrays shaped like ``output``.
            op: ``"sum"``, ``"product"``, ``"min"`` or ``"max"``.
            async_op: Return an AsyncWork (result: ``output``) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            ``output``, or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.
        """
        red = reduce_op(op)
        out = as_tensor(output, "output", "reduce_scatter", writable=True)
        check_reducible(out, "output", "reduce_scatter")
        given: object = inputs  # a str is a Sequence too: refused whatever its length
        if isinstance(given, (str, bytes)) or len(inputs) != self.world_size:
            raise ValueError(f"inputs: expected {self.world_size} tensors, got {len(inputs)}")
        ins = [as_tensor(x, f"inputs[{i}]", "reduce_scatter") for i, x in enumerate(inputs)]
        for i, x in enumerate(ins):
            if x.shape != out.shape or x.dtype != out.dtype:
                raise ValueError(
                    f"reduce_scatter: inputs[{i}] is {x.dtype}{tuple(x.shape)}, output is"
                    f" {out.dtype}{tuple(out.shape)}; they must match"
                )

        def run(pg: GlooGroup, dl: float | None) -> ArrayT:
            # gloo's own reduce_scatter hangs on torch 2.13 (measured). Large: a ring over
            # point-to-point messages (half the bytes of an allreduce); small: one
            # allreduce of the inputs laid end to end (one gloo operation, lowest latency).
            if self._shm.reduce_scatter(out, ins, red, dl):
                return output
            n = out.numel()
            if n * out.element_size() >= RING_MIN_BYTES and ring_op(red):
                ring_reduce_scatter(
                    pg,
                    self.rank,
                    self.world_size,
                    out,
                    ins,
                    red,
                    self._scratch(out.dtype, 2 * n),
                    lambda works: self._wait(works, "reduce_scatter", dl, p2p=True),
                )
                return output
            flat = self._scratch(out.dtype, n * self.world_size)
            torch.cat([x.reshape(-1) for x in ins], out=flat)
            opts = self._opts("AllreduceOptions", dl, red)
            self._wait([pg.allreduce([flat], opts)], "reduce_scatter", dl)
            out.copy_(flat[self.rank * n : (self.rank + 1) * n].view(out.shape))
            return output

        return self._submit("reduce_scatter", run, timeout, async_op)
