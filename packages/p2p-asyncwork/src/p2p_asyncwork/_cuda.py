"""CUDA event helpers that degrade to no-ops on a CPU-only torch or before CUDA is used."""

from __future__ import annotations

from typing import Any

import torch


def record_event_if_cuda() -> Any:
    """Record an event on the current CUDA stream, or return None when CUDA is not in use.

    CUDA is never initialized here: on a process that has not touched the GPU yet,
    there is nothing to order against, so no event is needed.
    """
    if not torch.cuda.is_available():
        return None
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return None
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream())
    return event


def stream_wait(event: Any) -> None:
    """Make the caller's current CUDA stream wait on ``event`` (no host blocking)."""
    if event is None:
        return
    torch.cuda.current_stream().wait_event(event)
