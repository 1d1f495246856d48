"""Raw-byte access to CPU tensor memory without copies.

Codecs read and write tensor storage through its address: ctypes calls take the
pointer, and buffer-protocol APIs get a ``memoryview`` over the same memory made by
``PyMemoryView_FromMemory`` (no numpy, no per-size ctypes array types).
"""

from __future__ import annotations

import ctypes

import torch

_PyBUF_READ = 0x100
_PyBUF_WRITE = 0x200
_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_from_memory.restype = ctypes.py_object
_from_memory.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)

# A valid address for zero-byte operations (a zero-size tensor may have data_ptr() == 0).
_SCRATCH = ctypes.create_string_buffer(16)
SCRATCH_ADDRESS: int = ctypes.addressof(_SCRATCH)


def tensor_bytes(tensor: object, name: str) -> int:
    """Check that ``tensor`` is a dense contiguous CPU tensor and return its byte count.

    Args:
        tensor: the tensor to check.
        name: the argument name used in error messages.

    Returns:
        ``numel() * element_size()``.

    Raises:
        TypeError: not a tensor.
        ValueError: not on the CPU, not strided, quantized, not contiguous, or with a
            pending conjugate/negative bit (its memory is not its value).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if (
        tensor.is_cpu
        and tensor.layout is torch.strided
        and tensor.is_contiguous()
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
    ):
        return tensor.numel() * tensor.element_size()
    desc = f"{name} (dtype {tensor.dtype}, shape {tuple(tensor.shape)}"
    if tensor.device.type != "cpu":
        raise ValueError(f"{desc}, device {tensor.device}) must be a CPU tensor")
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise ValueError(f"{desc}, layout {tensor.layout}) must be a dense strided tensor")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{desc}, stride {tensor.stride()}) must be contiguous; call .contiguous() first"
        )
    raise ValueError(f"{desc}) has a lazy conj/neg bit; call .resolve_conj() first")


def uint8_buffer_bytes(buffer: object, name: str) -> int:
    """Like :func:`tensor_bytes`, and also require dtype ``torch.uint8``."""
    nbytes = tensor_bytes(buffer, name)
    assert isinstance(buffer, torch.Tensor)
    if buffer.dtype != torch.uint8:
        raise ValueError(f"{name} must be a torch.uint8 tensor, got dtype {buffer.dtype}")
    return nbytes


def tensor_pieces(obj: object, name: str) -> list[tuple[torch.Tensor, str]]:
    """``obj`` as checked pieces: one tensor, or a list or tuple of them read end to end.

    Each piece is checked with :func:`tensor_bytes` and paired with the name errors give
    it (``name``, or ``name[i]`` for the ``i``-th of a list).

    Raises:
        TypeError: ``obj`` is neither a tensor nor a list or tuple, or a piece is not a
            tensor.
        ValueError: a piece is not a contiguous dense CPU tensor.
    """
    if isinstance(obj, torch.Tensor):
        items: list[tuple[object, str]] = [(obj, name)]
    elif isinstance(obj, (list, tuple)):
        items = [(t, f"{name}[{i}]") for i, t in enumerate(obj)]
    else:
        raise TypeError(
            f"{name} must be a torch.Tensor or a list of them, got {type(obj).__name__}"
        )
    out: list[tuple[torch.Tensor, str]] = []
    for t, label in items:
        tensor_bytes(t, label)
        assert isinstance(t, torch.Tensor)
        out.append((t, label))
    return out


def address(tensor: torch.Tensor, nbytes: int) -> int:
    """Return the tensor's first byte, or a scratch address when it holds no bytes."""
    return tensor.data_ptr() if nbytes else SCRATCH_ADDRESS


def memory_view(tensor: torch.Tensor, nbytes: int, *, writable: bool) -> memoryview:
    """Return a flat ``B``-format memoryview over the tensor's bytes (no copy).

    The view does not keep the tensor alive: hold the tensor while the view is used.
    """
    if nbytes == 0:
        return memoryview(bytearray() if writable else b"")
    flags = _PyBUF_WRITE if writable else _PyBUF_READ
    view: memoryview = _from_memory(tensor.data_ptr(), nbytes, flags)
    return view
