"""The one adapter over torch's private gloo and c10d APIs (torch 2.4 - 2.13 measured).

Every private name p2p-collective uses is here, each with why; the rest of the package
calls these functions. ``tests/test_torch_private.py`` fails loudly when torch renames
or drops one of them.

* ``ProcessGroupGloo._Options`` with ``_devices``, ``_timeout`` and ``_threads``: the only
  way to hand gloo a device bound to *our* host address (the public constructor
  ``ProcessGroupGloo(store, rank, size, timeout)`` picks one from the hostname or
  ``GLOO_SOCKET_IFNAME``, which on a multi-homed node can be the wrong interface) and to
  size its thread pool (point-to-point groups never use it).
* ``torch._C._distributed_c10d.AllgatherOptions``: ``ProcessGroup.allgather`` takes an
  options object with a per-call timeout; torch re-exports the other ``*Options``
  classes from ``torch.distributed`` (used from there) but not this one.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch._C._distributed_c10d import (
        AllgatherOptions,
        AllreduceOptions,
        BarrierOptions,
        BroadcastOptions,
        ReduceOp,
        ReduceOptions,
        Store,
        Work,
    )

    OpOptions: TypeAlias = (
        AllgatherOptions | AllreduceOptions | BarrierOptions | BroadcastOptions | ReduceOptions
    )
    """An options object of :func:`op_options`."""
    GlooReduceOp: TypeAlias = ReduceOp | ReduceOp.RedOpType
    """A reduction (``ReduceOp.SUM``, ...) as the ``reduceOp`` field of an options object."""

# torch's stubs do not declare these constructors (or the private AllgatherOptions) the
# way they are called here: the untyped module objects stay behind the typed functions.
_PREFIX_STORE: Any = dist.PrefixStore  # type: ignore[attr-defined]
_GLOO: Any = dist.ProcessGroupGloo
_C10D: Any = torch._C._distributed_c10d  # private: AllgatherOptions is not re-exported


class GlooDevice(Protocol):
    """A gloo TCP device (opaque: only handed back to :func:`new_gloo_group`)."""


class GlooGroup(Protocol):
    """The operations p2p-collective calls on a gloo process group (torch's Backend)."""

    def broadcast(self, tensors: list[torch.Tensor], opts: OpOptions, /) -> Work: ...

    def allreduce(self, tensors: list[torch.Tensor], opts: OpOptions, /) -> Work: ...

    def reduce(self, tensors: list[torch.Tensor], opts: OpOptions, /) -> Work: ...

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: OpOptions, /
    ) -> Work: ...

    def barrier(self, opts: OpOptions, /) -> Work: ...

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int, /) -> Work: ...

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int, /) -> Work: ...


def make_device(host: str) -> GlooDevice:
    """A gloo TCP device bound to ``host`` (an address of this machine, e.g. 127.0.0.1)."""
    return cast("GlooDevice", _GLOO.create_device(hostname=host))


def new_gloo_group(
    store: Store,
    prefix: str,
    rank: int,
    size: int,
    device: GlooDevice,
    timeout: datetime.timedelta,
    threads: int,
) -> GlooGroup:
    """A standalone gloo process group of ``size`` ranks under ``prefix``, bound to ``device``.

    Built directly, never through ``init_process_group``, so it never touches a default
    process group the user may have.
    """
    scoped = _PREFIX_STORE(f"{prefix}/gloo", store)
    make_options = getattr(_GLOO, "_Options", None)
    if make_options is None:  # pragma: no cover - a torch without device options
        # The timedelta constructor picks its device from GLOO_SOCKET_IFNAME or the hostname.
        return cast("GlooGroup", _GLOO(scoped, rank, size, timeout))
    opts = make_options()
    opts._devices = [device]  # private: the device bound to our host (see the module doc)
    opts._timeout = timeout  # private: the options object replaces the timedelta argument
    opts._threads = threads  # private: gloo's collective thread pool size
    return cast("GlooGroup", _GLOO(scoped, rank, size, opts))


_PUBLIC_OPTIONS = ("AllreduceOptions", "BroadcastOptions", "ReduceOptions", "BarrierOptions")


def op_options(cls: str, timeout: datetime.timedelta, **fields: int | GlooReduceOp) -> OpOptions:
    """An options object of a collective (``"AllreduceOptions"``, ...) with its timeout.

    Raises:
        ValueError: ``cls`` is not one of the options classes used here.
    """
    if cls in _PUBLIC_OPTIONS:
        opts: OpOptions = getattr(dist, cls)()
    elif cls == "AllgatherOptions":
        opts = _C10D.AllgatherOptions()  # private: not re-exported by torch.distributed
    else:
        raise ValueError(
            f"cls: got {cls!r}; allowed: AllgatherOptions, {', '.join(_PUBLIC_OPTIONS)}"
        )
    opts.timeout = timeout
    for key, value in fields.items():
        setattr(opts, key, value)
    return opts
