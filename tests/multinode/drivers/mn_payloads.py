"""Payloads shared by the two-node drivers and their workers (no p2p import here).

Ray adds the driver script's folder to every worker's ``sys.path``, and both "nodes"
share this machine's filesystem, so workers on either node import this module by name;
the dataclass payload must be importable for plain pickle on the receiving side.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch


@dataclass
class Sample:
    """A dataclass payload: tensor fields travel as tensors, the rest is pickled."""

    tokens: torch.Tensor
    mask: torch.Tensor
    step: int
    note: str


def payloads(seed: int) -> dict[str, Any]:
    """Every payload kind of ``send``/``recv``, deterministic for a seed."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "tensor": torch.randn(256, 1024, generator=gen),  # 1 MiB float32
        "large_tensor": torch.randint(0, 256, (16 * 1024**2,), dtype=torch.uint8, generator=gen),
        "empty_tensor": torch.empty(0, 3),
        "tensor_list": [
            torch.randint(0, 32000, (4096,), dtype=torch.int64, generator=gen),
            torch.randn(64, 64, generator=gen).half(),
            torch.rand(100, generator=gen) > 0.5,
        ],
        "tensor_tuple": (torch.arange(10), torch.ones(2, 2, dtype=torch.float64)),
        "tensor_dict": {"z": torch.arange(5), "a": torch.randn(3, 3, generator=gen)},
        "dataclass": Sample(torch.arange(128), torch.ones(128, dtype=torch.bool), 7, "seven"),
        "object": {"msg": "hello across the link", "numbers": list(range(10)), "nested": (1, "x")},
    }


def send_tensor_payload(seed: int) -> torch.Tensor:
    """The tensor sent with ``send_tensor`` (4 MiB float32)."""
    return torch.randn(1024, 1024, generator=torch.Generator().manual_seed(seed + 1))


def same(a: Any, b: Any) -> bool:
    """Exact structural equality: types, key order, dtypes, shapes and values."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return bool(a == b)


def tcp_peers() -> list[str]:
    """Remote IPv4 addresses of this process's established TCP connections."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    peers = []
    with open("/proc/self/net/tcp") as fh:
        next(fh)
        for line in fh:
            cols = line.split()
            state, inode = cols[3], cols[9]
            if state == "01" and inode in inodes:  # ESTABLISHED and ours
                raw = bytes.fromhex(cols[2].split(":")[0])
                peers.append(socket.inet_ntoa(struct.pack("<I", struct.unpack(">I", raw)[0])))
    return peers
