"""Static check of the typed seam: what ``Worker`` communication returns, per ``async_op``.

Not a pytest module: ``nox -s "typecheck(package='worker')"`` runs mypy --strict over
this file, so a change that loses a handle's type (back to ``Any``) or the overloads on
``async_op`` fails type checking. Nothing here runs.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import assert_type

from p2p_asyncwork import AsyncWork
from p2p_collective import Collective, MultiCollectiveGroup
from p2p_worker import Worker


def handles(w: Worker, flag: bool, buf: torch.Tensor) -> None:
    """Every communication method, sync and async, with the type a checker must see."""
    assert_type(w.send("x", "trainer", 0), None)
    assert_type(w.send("x", "trainer", 0, async_op=True), AsyncWork[None])
    assert_type(w.send("x", "trainer", 0, True), AsyncWork[None])
    assert_type(w.send("x", "trainer:0", 1, async_op=flag), AsyncWork[None] | None)
    assert_type(w.recv("trainer", (0, 1)), Any)
    assert_type(w.recv("trainer", 0, async_op=True), AsyncWork[Any])
    assert_type(w.send_tensor(buf, "trainer", 0), None)
    assert_type(w.send_tensor(buf, "trainer", 0, async_op=True), AsyncWork[None])
    assert_type(w.recv_tensor(buf, "trainer", 0), torch.Tensor)
    assert_type(w.recv_tensor(buf, "trainer", 0, async_op=True), AsyncWork[torch.Tensor])
    assert_type(
        w.recv_tensor(buf, "trainer", 0, async_op=flag), AsyncWork[torch.Tensor] | torch.Tensor
    )
    assert_type(w.broadcast(buf, members=["trainer"], async_op=True), AsyncWork[Any])
    assert_type(w.collective, Collective)
    assert_type(w.create_collective(["trainer"]), MultiCollectiveGroup)
    work = w.recv_tensor(buf, "trainer", 0, async_op=True)
    assert_type(work.wait(timeout=1.0), torch.Tensor)
