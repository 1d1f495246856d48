"""The job token: members of a group prove to each other at rendezvous that they hold it.

The token itself never enters the store. At each rendezvous (one direction of a two-party
group, or an N-member group) every participant publishes a fresh random nonce, or
``none`` when it has no token, before it announces itself. Once all have announced, each
computes ``HMAC-SHA256(token, transcript || own id)`` over a transcript of the store
prefix and every participant's id and nonce, publishes that proof and checks every
other participant's proof with :func:`hmac.compare_digest`. A nonce of its own in every
transcript means an observed proof never verifies at a later rendezvous.

A process without the token (or with another one) cannot produce a proof that
verifies, so it cannot join; both sides fail with :class:`AuthenticationError`. This
keeps stray processes and other jobs out; it does not encrypt anything, and a party
that can write the store can still disturb a rendezvous (see the trust model).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import NoReturn

from p2p_collective._deadline import deadline_after, remaining
from p2p_collective._errors import AuthenticationError, CollectiveError, CollectiveTimeoutError
from p2p_collective._links._transport import StoreLike

TOKEN_ENV = "P2P_JOB_TOKEN"
"""Environment variable a :class:`~p2p_collective.Collective` reads its job token from."""

_NONE = b"none"
_SCHEME = b"hmac-sha256:"
_TRANSCRIPT = b"p2p-job-token/v1"
_KEEP_NONCES = 4096  # nonces kept (a retried rendezvous must show the same one)


class FromEnv(enum.Enum):
    ENV = "env"

    def __repr__(self) -> str:
        return f"${TOKEN_ENV}"


FROM_ENV = FromEnv.ENV
"""Default of ``Collective(job_token=...)``: read the token from ``$P2P_JOB_TOKEN``."""


def token_key(job_token: object) -> bytes | None:
    """The HMAC key of a ``job_token`` argument (None: no token, no check).

    Raises:
        TypeError: ``job_token`` is not str, bytes or None.
        ValueError: ``job_token`` is empty.
    """
    if job_token is FROM_ENV:
        return os.environ.get(TOKEN_ENV, "").encode() or None
    if job_token is None:
        return None
    if isinstance(job_token, (bytes, bytearray)):
        key = bytes(job_token)
    elif isinstance(job_token, str):
        key = job_token.encode()
    else:
        raise TypeError(f"job_token: expected str, bytes or None, got {type(job_token).__name__}")
    if not key:
        raise ValueError("job_token: got an empty token; allowed: a non-empty str/bytes or None")
    return key


class JobAuth:
    """This process's side of the token check: the key and its nonces per rendezvous.

    One per :class:`~p2p_collective.Collective`. A nonce is kept after its first use (the
    latest 4096), so a rendezvous retried after a timeout (same prefix) shows the peer
    the same nonce it may already have answered.

    Args:
        key: The token's bytes, or None for no token.
    """

    def __init__(self, key: bytes | None) -> None:
        self._key = key
        self._nonces: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobAuth {'token set' if self._key is not None else 'no token'}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a JobAuth holds the job token and is never pickled")

    @property
    def enabled(self) -> bool:
        """Whether this process holds a token (and so requires one of its peers)."""
        return self._key is not None

    def _nonce(self, slot: str) -> bytes:
        with self._lock:
            nonce = self._nonces.get(slot)
            if nonce is None:
                if len(self._nonces) >= _KEEP_NONCES:  # the oldest rendezvous are long over
                    del self._nonces[next(iter(self._nonces))]
                nonce = self._nonces[slot] = secrets.token_hex(32).encode()
            return nonce

    def publish(self, store: StoreLike, prefix: str, me: str) -> None:
        """Publish this side's nonce (or ``none``); call it before announcing this side.

        Raises:
            CollectiveError: The store failed.
        """
        value = _NONE if self._key is None else _SCHEME + self._nonce(f"{prefix}/{me}")
        try:
            store.set(f"{prefix}/auth/{me}", value)
        except Exception as exc:
            raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc

    def verify(
        self,
        store: StoreLike,
        prefix: str,
        me: str,
        others: Mapping[str, str],
        where: str,
        timeout: float | None,
        wait_key: Callable[[str, float | None], bool],
    ) -> None:
        """Prove the token to the other participants and check their proofs.

        Call it once every participant has announced itself (its nonce is then in the
        store).

        Args:
            store: The rendezvous store client.
            prefix: The rendezvous' key prefix.
            me: This side's id at the rendezvous (a role or a rank).
            others: The other participants: id -> name (for messages).
            where: The group, for messages (e.g. ``p2p[a+b]``).
            timeout: Seconds to wait for the others' proofs.
            wait_key: ``wait_key(key, timeout)``: True once ``key`` exists.

        Raises:
            AuthenticationError: A participant holds no token while this side does (or
                the other way round), or its proof does not verify or never came.
            CollectiveError: The store failed.
        """
        try:
            theirs = {i: _read(store, f"{prefix}/auth/{i}") for i in others}
        except Exception as exc:
            raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc
        for i, value in theirs.items():
            if self._key is not None and not value.startswith(_SCHEME):
                raise AuthenticationError(
                    f"{where}: peer {others[i]!r} presented no job token, but this process"
                    f" holds one and accepts only peers of its job (give every process the"
                    f" same {TOKEN_ENV} / job_token); refusing to connect"
                )
            if self._key is None and value != _NONE:
                raise AuthenticationError(
                    f"{where}: peer {others[i]!r} requires a job token, but this process"
                    f" holds none (set {TOKEN_ENV} or pass job_token to Collective);"
                    " refusing to connect"
                )
        if self._key is None:
            return
        nonces = {i: v[len(_SCHEME) :] for i, v in theirs.items()}
        nonces[me] = self._nonce(f"{prefix}/{me}")
        transcript = b"\0".join(
            [_TRANSCRIPT, prefix.encode()] + [i.encode() + b"=" + nonces[i] for i in sorted(nonces)]
        )
        try:
            store.set(f"{prefix}/auth/{me}/proof", self._proof(transcript, me).encode())
        except Exception as exc:
            raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc
        end = deadline_after(timeout)
        for i, name in others.items():
            key = f"{prefix}/auth/{i}/proof"
            try:
                found = wait_key(key, remaining(end))
                proof = bytes(store.get(key)) if found else None
            except CollectiveError:
                raise
            except Exception as exc:
                raise CollectiveError(f"rendezvous store failed at {key!r}: {exc}") from exc
            if proof is None:
                raise AuthenticationError(
                    f"{where}: peer {name!r} did not prove that it holds the job token"
                    f" within {timeout} s; refusing to connect"
                ) from CollectiveTimeoutError(f"no proof at {key!r}")
            if not hmac.compare_digest(proof, self._proof(transcript, i).encode()):
                raise AuthenticationError(
                    f"{where}: peer {name!r} does not hold this job's token (its proof did"
                    " not verify): a process of another job, or a stray one, tried to join;"
                    " refusing to connect"
                )

    def mac(self, data: bytes) -> bytes | None:
        """HMAC-SHA256 of ``data`` under the token (None without a token).

        Used where a connection made outside the rendezvous (the shared-memory socket)
        must prove the token too.
        """
        if self._key is None:
            return None
        return hmac.new(self._key, data, hashlib.sha256).digest()

    def _proof(self, transcript: bytes, who: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, transcript + b"\0" + who.encode(), hashlib.sha256).hexdigest()


def _read(store: StoreLike, key: str) -> bytes:
    """The value of ``key``, or b"" when it is missing (a peer that published nothing)."""
    return bytes(store.get(key)) if store.check([key]) else b""
