"""Error types of p2p-collective.

Every public type here derives from :class:`p2p_asyncwork.P2PError`, whose ``__reduce__``
keeps the message and the ``__cause__`` when an error is pickled (for instance across a Ray
actor boundary). :class:`CleanFailure`, last, is internal: the wrapper an operation raises
to tell its direction's executor that nothing reached the wire.
"""

from __future__ import annotations

from p2p_asyncwork import P2PError


class CollectiveError(P2PError, RuntimeError):
    """Base of every run-time error raised by p2p-collective.

    Also a ``RuntimeError``, the type ``torch.distributed`` and ``ray.util.collective``
    raise for a failed collective, so code written for them catches these too.
    """


class FramingError(CollectiveError):
    """A received frame is not what this side expected.

    Raised when the magic, version or per-direction sequence number of a frame does not
    match, or its metadata is inconsistent. The usual cause is an unpaired call: one side
    called ``send_tensor`` and the other ``recv``, or ``send`` answered by ``recv_tensor``.
    The direction of the group is broken afterwards.
    """


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """An operation or a rendezvous did not complete within its timeout."""


class PeerError(CollectiveError):
    """The transport to the peer failed, typically because the peer process died."""


class GroupBrokenError(CollectiveError):
    """An earlier failure broke this direction of the group; its ``__cause__`` is that failure.

    A direction breaks when an operation fails after it may have put bytes on the wire
    (or taken them off), since the two sides can no longer agree where the next message
    starts. Close the group on both sides and create a new one.
    """


class PeerGoneError(PeerError, GroupBrokenError):
    """An operation toward a peer already known to be gone; ``__cause__`` is the first report.

    Raised at once by every operation (and every queued one) of a group whose peer died,
    in every group that includes it, until the group is created again with a new
    incarnation of the peer. It is a :class:`PeerError` (the peer is gone) and a
    :class:`GroupBrokenError` (the group cannot carry on), so either ``except`` catches it.
    """


class GroupClosedError(CollectiveError):
    """The group (or its :class:`~p2p_collective.Collective`) was closed."""


class ObjectRefusedError(CollectiveError):
    """A received object was refused by this side's ``object_policy`` (``"plain"``).

    The message names the refused global (``module.qualname``) and the policy. Nothing
    of the refused object ran: the restricted unpickler stops at the global's name. The
    whole message was taken off the wire first, so the group stays usable.
    """


class AuthenticationError(CollectiveError):
    """A peer did not prove that it holds this job's token at rendezvous (or vice versa).

    Raised on both sides when one holds a token and the other none, or their tokens
    differ. The message names the group and the peer, never the token.
    """


class CleanFailure(Exception):
    """Raised by an operation that failed before touching the wire; carries the real error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
