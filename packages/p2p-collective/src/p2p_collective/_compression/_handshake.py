"""The wire-config handshake: both ends of a direction must speak the same frames.

Each side publishes a fingerprint (frame version and compression section) under the
direction's rendezvous prefix before meeting the peer and compares the peer's after:
a mismatch is a clear :class:`~p2p_collective.CollectiveError` naming both, instead of
frames one side cannot read.
"""

from __future__ import annotations

import json
from typing import Any

from p2p_collective._errors import CollectiveError
from p2p_collective._frames._framing import FRAME_VERSION
from p2p_collective._links._transport import StoreLike
from p2p_compress import TensorCompressionConfig


def wire_fingerprint(config: TensorCompressionConfig | None) -> str:
    """The canonical JSON of what both ends of a group must share.

    The frame version (it also stands for the message protocol: header and payload tags)
    and the compression section. Buffer pool size, timeouts and link emulation are local
    to each process (emulation is paced by each sender on its own) and are not part of it.
    """
    section: dict[str, Any] | None = None
    if config is not None:
        section = config.to_dict()
        section["excluded_dtypes"] = sorted(section["excluded_dtypes"])
    return json.dumps(
        {"frame_version": FRAME_VERSION, "tensor_compression": section},
        sort_keys=True,
        separators=(",", ":"),
    )


def _frame_version(fingerprint: str | None) -> object:
    try:
        return json.loads(fingerprint or "null").get("frame_version")
    except (ValueError, AttributeError):
        return None


def publish_wire_config(store: StoreLike, prefix: str, role: str, fingerprint: str) -> None:
    """Publish this side's fingerprint under the direction's prefix (before announcing)."""
    try:
        store.set(f"{prefix}/{role}/wire", fingerprint.encode())
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc


def check_peer_wire_config(
    store: StoreLike, prefix: str, peer_role: str, fingerprint: str, me: str, peer: str
) -> None:
    """Compare the peer's published fingerprint (after meeting it) with ours.

    Raises:
        CollectiveError: The peer holds a different compression config (both are named)
            or published none.
    """
    key = f"{prefix}/{peer_role}/wire"
    try:
        theirs = bytes(store.get(key)).decode() if store.check([key]) else None
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {key!r}: {exc}") from exc
    if theirs == fingerprint:
        return
    mine_v, theirs_v = _frame_version(fingerprint), _frame_version(theirs)
    if mine_v != theirs_v:
        raise CollectiveError(
            f"{me!r} and its peer {peer!r} speak different p2p-collective wire protocols:"
            f" frame version {mine_v} here, {theirs_v or 'older than 4'} at {peer!r}; every"
            " process of a job must run the same p2p-collective version"
        )
    raise CollectiveError(
        f"{me!r} and its peer {peer!r} hold different job-level wire configurations: "
        f"{me!r} has {fingerprint}, {peer!r} has "
        f"{theirs if theirs is not None else 'none (an older p2p-collective?)'}; every "
        "process of a job must be given the same cluster.collective.tensor_compression"
    )
