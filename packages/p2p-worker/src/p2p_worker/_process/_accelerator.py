"""Which accelerator this process sees: ``Worker.torch_platform`` and ``Worker.torch_device_type``.

RLinf code picks devices through two class attributes of its ``Worker``:
``torch_device_type`` (``"cuda"``, or ``None`` without an accelerator) and
``torch_platform`` (the ``torch.cuda`` module, or ``None``). They are read on the class
as often as on an instance (``Worker.torch_platform.set_device(...)``), in the driver
and in workers. :class:`AcceleratorAttribute` gives both readings, detected lazily on
first access so that importing ``p2p_worker`` never touches CUDA.
"""

from __future__ import annotations

from typing import Any


def detect_device_type() -> str | None:
    """Return ``"cuda"`` when this process sees a CUDA device, else ``None``.

    Uses ``torch.cuda.is_available()``, which asks the driver for a device count
    without creating a CUDA context.
    """
    import torch

    return "cuda" if torch.cuda.is_available() else None


class AcceleratorAttribute:
    """A class attribute computed on first read: the device type or the torch platform.

    Works on the class (``Worker.torch_device_type``) and on instances alike; assigning
    the attribute on a class or instance overrides it, as with a plain attribute.

    Args:
        kind: ``"device_type"`` (a str or ``None``) or ``"platform"`` (a module or ``None``).

    Example:
        >>> class W:
        ...     torch_device_type = AcceleratorAttribute("device_type")
        >>> W.torch_device_type in (None, "cuda")
        True
    """

    def __init__(self, kind: str) -> None:
        if kind not in ("device_type", "platform"):
            raise ValueError(f"kind={kind!r}; allowed: 'device_type', 'platform'")
        self.kind = kind

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        device_type = detect_device_type()
        if self.kind == "device_type" or device_type is None:
            return device_type
        import torch

        return getattr(torch, device_type)
