"""TimedSocket: a blocking socket whose waits the kernel ends at each call's deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from p2p_collective._links._timed_socket import SLACK, TimedSocket


@pytest.fixture
def pair() -> Iterator[tuple[TimedSocket, socket.socket]]:
    a, b = socket.socketpair()
    yield TimedSocket(a), b
    a.close()
    b.close()


def _send_later(sock: socket.socket, data: bytes, after: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after), sock.sendall(data)))
    thread.start()
    return thread


def test_the_socket_is_blocking_and_one_call_receives_what_arrived(
    pair: tuple[TimedSocket, socket.socket],
) -> None:
    ts, peer = pair
    assert ts.sock.gettimeout() is None
    peer.sendall(b"abcdef")
    buf = bytearray(16)
    assert ts.recv_into(memoryview(buf), time.monotonic() + 5) == 6
    assert bytes(buf[:6]) == b"abcdef"


def test_a_receive_times_out_at_its_deadline_and_the_socket_stays_usable(
    pair: tuple[TimedSocket, socket.socket],
) -> None:
    ts, peer = pair
    buf = bytearray(4)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ts.recv_into(memoryview(buf), start + 0.2)
    took = time.monotonic() - start
    assert 0.19 <= took < 0.2 + SLACK + 0.3
    peer.sendall(b"late")
    assert ts.recv_into(memoryview(buf), time.monotonic() + 5) == 4
    assert bytes(buf) == b"late"


def test_a_nearer_deadline_than_the_last_is_honoured(
    pair: tuple[TimedSocket, socket.socket],
) -> None:
    ts, peer = pair
    buf = bytearray(1)
    peer.sendall(b"x")
    assert ts.recv_into(memoryview(buf), time.monotonic() + 30) == 1  # the kernel holds ~30 s
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ts.recv_into(memoryview(buf), start + 0.15)
    assert time.monotonic() - start < 0.15 + SLACK + 0.3


def test_a_wait_the_kernel_ends_early_goes_on_until_the_data_comes(
    pair: tuple[TimedSocket, socket.socket],
) -> None:
    ts, peer = pair
    buf = bytearray(2)
    with pytest.raises(TimeoutError):  # leaves a 0.05 s limit in the kernel
        ts.recv_into(memoryview(buf), time.monotonic() + 0.05)
    thread = _send_later(peer, b"ok", 0.3)
    try:
        # The 0.05 s limit runs out several times before the data comes: no TimeoutError.
        assert ts.recv_into(memoryview(buf), time.monotonic() + 5) == 2
    finally:
        thread.join()
    assert bytes(buf) == b"ok"


def test_no_deadline_waits_without_limit(pair: tuple[TimedSocket, socket.socket]) -> None:
    ts, peer = pair
    buf = bytearray(3)
    with pytest.raises(TimeoutError):
        ts.recv_into(memoryview(buf), time.monotonic() + 0.05)
    thread = _send_later(peer, b"yes", 0.3)
    try:
        assert ts.recv_into(memoryview(buf), None) == 3
    finally:
        thread.join()
    assert bytes(buf) == b"yes"


def test_a_past_deadline_raises_before_any_system_call(
    pair: tuple[TimedSocket, socket.socket],
) -> None:
    ts, peer = pair
    peer.sendall(b"z")
    with pytest.raises(TimeoutError):
        ts.recv_into(memoryview(bytearray(1)), time.monotonic() - 1)
    buf = bytearray(1)
    assert ts.recv_into(memoryview(buf), time.monotonic() + 5) == 1  # nothing was taken
    assert buf == bytearray(b"z")


def test_a_send_into_a_full_socket_times_out_after_sending_what_fit(
    pair: tuple[TimedSocket, socket.socket],
) -> None:
    ts, peer = pair
    chunk = memoryview(bytes(1 << 20))
    sent = 0
    start = time.monotonic()
    timed_out = False
    while not timed_out and time.monotonic() - start < 5:  # nobody reads: the buffer fills
        try:
            sent += ts.sendmsg([chunk], time.monotonic() + 0.2)
        except TimeoutError:
            timed_out = True
    assert timed_out
    assert sent > 0
    assert time.monotonic() - start < 5
    got = 0
    peer.settimeout(5)
    while got < sent:  # every byte counted as sent is there, in order
        got += len(peer.recv(1 << 20))
    assert got == sent


def test_end_of_file_is_a_zero_length_receive(pair: tuple[TimedSocket, socket.socket]) -> None:
    ts, peer = pair
    peer.shutdown(socket.SHUT_WR)
    assert ts.recv_into(memoryview(bytearray(8)), time.monotonic() + 5) == 0
