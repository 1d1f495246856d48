"""Run-time errors of the compression layer."""

from __future__ import annotations

from p2p_asyncwork import P2PError


class CompressionError(P2PError):
    """A codec failed: corrupt or truncated input, a missing codec library, a wire mismatch.

    Raised instead of ever returning garbage. The original library error, when there
    is one, is the ``__cause__``. Pickles with its message and cause.
    """


class CompressionTimeoutError(CompressionError, TimeoutError):
    """Waiting for a decoder (``acquire_decoder(timeout=...)``) ran out of time."""
