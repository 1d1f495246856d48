"""p2p_worker.compat without a Ray cluster: names, types, errors, a group of one."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import p2p_worker.compat as col
from p2p_collective import CollectiveError, PeerError
from p2p_worker import WorkerError
from p2p_worker.compat.types import Backend, ReduceOp

RAY_NAMES = [
    "nccl_available",
    "gloo_available",
    "is_backend_available",
    "is_group_initialized",
    "init_collective_group",
    "destroy_collective_group",
    "create_collective_group",
    "get_rank",
    "get_collective_group_size",
    "allreduce",
    "allreduce_multigpu",
    "barrier",
    "reduce",
    "reduce_multigpu",
    "broadcast",
    "broadcast_multigpu",
    "allgather",
    "allgather_multigpu",
    "reducescatter",
    "reducescatter_multigpu",
    "send",
    "send_multigpu",
    "recv",
    "recv_multigpu",
    "get_group_handle",
    "register_collective_backend",
    "synchronize",
]


def test_every_name_of_ray_util_collective_exists_with_rays_parameters() -> None:
    import ray.util.collective as ray_col
    from ray.util.collective import collective as ray_functions  # synchronize lives here

    for name in RAY_NAMES:
        ours, theirs = getattr(col, name), getattr(ray_functions, name)
        ours_params = list(inspect.signature(ours).parameters.values())
        theirs_params = list(inspect.signature(theirs).parameters.values())
        # Same positional names in the same order, same defaults; ours may add keywords.
        positional = [p for p in ours_params if p.kind is not p.KEYWORD_ONLY]
        assert [p.name for p in positional] == [p.name for p in theirs_params], name
        for mine, ray_param in zip(positional, theirs_params, strict=True):
            default = ray_param.default
            if isinstance(default, type(ray_col.types.ReduceOp.SUM)):
                assert mine.default.name == default.name, (name, mine.name)
            elif name != "is_group_initialized":  # Ray's has no default; ours "default"
                assert mine.default == default, (name, mine.name)


def test_types_match_rays() -> None:
    from ray.util.collective.types import Backend as RayBackend
    from ray.util.collective.types import ReduceOp as RayReduceOp

    assert [(op.name, op.value) for op in ReduceOp] == [(op.name, op.value) for op in RayReduceOp]
    for name in ("gloo", "GLOO", "torch_gloo", "nccl"):
        assert Backend(name) == RayBackend(name)
    with pytest.raises(ValueError, match="mpi"):
        Backend("mpi")
    assert col.reduce_scatter is col.reducescatter
    assert col.gloo_available()
    assert not col.nccl_available()
    assert col.is_backend_available("torch_gloo")
    assert not col.is_backend_available("nccl")


def test_group_of_one_needs_no_ray() -> None:
    col.init_collective_group(1, 0, backend="torch_gloo", group_name="unit-solo")
    try:
        t = torch.tensor([1.0, 2.0])
        col.allreduce(t, "unit-solo", op=ReduceOp.PRODUCT, timeout=1.0)
        col.broadcast(t, 0, "unit-solo")
        col.reduce(t, 0, "unit-solo")
        arrays = [np.zeros(2, dtype=np.float32)]
        col.allgather(arrays, t.numpy(), "unit-solo")
        out = np.zeros(2, dtype=np.float32)
        col.reducescatter(out, [np.array([3.0, 4.0], dtype=np.float32)], "unit-solo")
        col.barrier("unit-solo")
        assert t.tolist() == [1.0, 2.0]
        assert arrays[0].tolist() == [1.0, 2.0]
        assert out.tolist() == [3.0, 4.0]
        handle = col.get_group_handle("unit-solo")
        assert (handle.rank, handle.world_size, handle.group_name) == (0, 1, "unit-solo")
        assert handle.backend() == Backend.GLOO
        assert handle.group is None
        with pytest.raises(RuntimeError, match="own rank"):
            col.send(t, 0, "unit-solo")
        with pytest.raises(ValueError, match="dst_rank"):
            col.send(t, 1, "unit-solo")
        with pytest.raises(ValueError, match="must match"):
            col.allgather([torch.zeros(3)], t, "unit-solo")
        with pytest.raises(ValueError, match="timeout"):
            col.barrier("unit-solo", timeout=-1)
        with pytest.raises(ValueError, match="op"):
            col.allreduce(t, "unit-solo", op="average")
        with pytest.raises(RuntimeError, match="already initialized"):
            col.init_collective_group(1, 0, "gloo", "unit-solo")
    finally:
        col.destroy_collective_group("unit-solo")
    assert not col.is_group_initialized("unit-solo")
    with pytest.raises(RuntimeError, match="not initialized"):
        col.barrier("unit-solo")


def test_bad_initialization_is_refused_with_rays_types() -> None:
    with pytest.raises(AssertionError):
        col.init_collective_group(2, 2, "gloo", "unit-bad")
    with pytest.raises(AssertionError):
        col.init_collective_group(0, 0, "gloo", "unit-bad")
    with pytest.raises(ValueError, match="NCCL"):
        col.init_collective_group(2, 0, group_name="unit-bad")  # Ray's default: NCCL
    with pytest.raises(ValueError, match="group_name"):
        col.init_collective_group(1, 0, "gloo", "")
    with pytest.raises(ValueError, match="gloo_timeout"):
        col.init_collective_group(1, 0, "gloo", "unit-bad", gloo_timeout=-5)
    assert not col.is_group_initialized("unit-bad")


def test_multigpu_calls_name_the_missing_transport() -> None:
    calls = [
        lambda: col.allreduce_multigpu([torch.ones(1)]),
        lambda: col.reduce_multigpu([torch.ones(1)]),
        lambda: col.broadcast_multigpu([torch.ones(1)]),
        lambda: col.allgather_multigpu([[torch.ones(1)]], [torch.ones(1)]),
        lambda: col.reducescatter_multigpu([torch.ones(1)], [[torch.ones(1)]]),
        lambda: col.send_multigpu(torch.ones(1), 1, 0),
        lambda: col.recv_multigpu(torch.ones(1), 1, 0),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="NCCL") as info:
            call()
        assert isinstance(info.value, col.BackendUnavailableError)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA"):
            col.synchronize(0)
    with pytest.raises(RuntimeError, match="not supported"):
        col.register_collective_backend("MINE", object)


def test_errors_keep_rays_bases_and_pickle() -> None:
    for err in (
        col.GroupNotInitializedError("x"),
        col.GroupExistsError("x"),
        col.CollectiveArgumentError("x"),
        col.GroupSpecError("x"),
        col.TensorTypeError("x"),
        col.BackendUnavailableError("x"),
    ):
        assert isinstance(err, (RuntimeError, WorkerError))
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == "x"
    assert issubclass(col.GroupSpecError, AssertionError)
    assert issubclass(col.TensorTypeError, TypeError)
    assert issubclass(PeerError, RuntimeError)
    assert issubclass(CollectiveError, RuntimeError)


def test_two_members_without_ray_say_what_is_missing() -> None:
    code = (
        "import p2p_worker.compat as col\n"
        "try:\n"
        "    col.init_collective_group(2, 0, 'gloo', 'g')\n"
        "except RuntimeError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith("RayCollectiveError"), out
    assert "ray.init()" in out, out


def test_read_only_arrays_keep_every_other_check() -> None:
    # Writing into a read-only array is allowed (as in Ray, with one warning per process,
    # see tests/integration/test_ray_collective_readonly.py); the other checks stay.
    col.init_collective_group(1, 0, "gloo", "unit-ro", gloo_timeout=40000)
    try:
        assert col.get_group_handle("unit-ro").gloo_timeout == 40000
        strided = np.zeros((4, 4), dtype=np.float32)[:, 1]
        strided.flags.writeable = False
        with pytest.raises(ValueError, match="non-contiguous") as info:
            col.reducescatter(strided, [np.ones(4, dtype=np.float32)], "unit-ro")
        assert isinstance(info.value, col.CollectiveArgumentError)
        objects = np.array([None, None], dtype=object)
        objects.flags.writeable = False
        with pytest.raises(ValueError, match="dtype"):
            col.reducescatter(objects, [np.ones(2, dtype=np.float32)], "unit-ro")
        # read, not written: neither our warning nor torch's (warnings are errors here)
        source = np.array([3.0, 4.0], dtype=np.float32)
        source.flags.writeable = False
        out = np.zeros(2, dtype=np.float32)
        col.reducescatter(out, [source], "unit-ro")
        col.broadcast(source, 0, "unit-ro")
        col.allreduce(source, "unit-ro")
        assert out.tolist() == [3.0, 4.0]
        assert source.tolist() == [3.0, 4.0]
    finally:
        col.destroy_collective_group("unit-ro")
    col.init_collective_group(1, 0, "gloo", "unit-ro", gloo_timeout=0)
    try:
        assert col.get_group_handle("unit-ro").gloo_timeout is None  # 0: no limit
    finally:
        col.destroy_collective_group("unit-ro")


def test_an_error_filter_on_the_warning_refuses_read_only_arrays() -> None:
    # pytest turns warnings into errors here: every write into a read-only array then
    # raises the warning before anything is written, and the group stays usable.
    col.init_collective_group(1, 0, "gloo", "unit-ro-error")
    try:
        frozen = np.zeros(2, dtype=np.float32)
        frozen.flags.writeable = False
        for _ in range(2):
            with pytest.raises(col.ReadOnlyArrayWarning, match="read-only numpy array"):
                col.reducescatter(frozen, [np.ones(2, dtype=np.float32)], "unit-ro-error")
        assert frozen.tolist() == [0.0, 0.0]
        out = np.zeros(2, dtype=np.float32)
        col.reducescatter(out, [np.ones(2, dtype=np.float32)], "unit-ro-error")
        assert out.tolist() == [1.0, 1.0]
    finally:
        col.destroy_collective_group("unit-ro-error")
