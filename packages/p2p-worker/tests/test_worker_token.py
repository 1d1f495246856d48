"""The job token on a real embedded Ray cluster: handed to every worker, never in the store."""

from __future__ import annotations

import datetime
import os
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from p2p_collective import AuthenticationError, Collective
from p2p_worker import Cluster, PackedPlacementStrategy, Worker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

GROUP = "tokw"
SECRET = "this-job-only-" + "s" * 40


def listening_sockets() -> list[tuple[str, int]]:
    """``(ip, port)`` of every TCP socket of this process in the LISTEN state."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:
                    continue
                hex_ip, hex_port = cols[1].split(":")
                raw = bytes.fromhex(hex_ip)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                if width == 8:
                    ip = ".".join(str(b) for b in words)
                else:
                    ip = ":".join(words[i : i + 2].hex() for i in range(0, 16, 2))
                found.append((ip, int(hex_port, 16)))
    return found


class TokenWorker(Worker):
    def listeners(self) -> list[tuple[str, int]]:
        return listening_sockets()

    def talk(self) -> Any:
        """Rank 0 and 1 exchange a tensor dict and an object."""
        if self._rank == 0:
            self.send({"w": torch.arange(4)}, dst_group_name=GROUP, dst_rank=1)
            return self.recv(src_group_name=GROUP, src_rank=1, timeout=60)
        if self._rank == 1:
            got = self.recv(src_group_name=GROUP, src_rank=0, timeout=60)
            self.send({"ack": got["w"].tolist()}, dst_group_name=GROUP, dst_rank=0)
            return got["w"].tolist()
        return None

    def recv_from(self, src_rank: int) -> tuple[str, str]:
        try:
            return ("ok", repr(self.recv(src_group_name=GROUP, src_rank=src_rank, timeout=60)))
        except Exception as exc:
            return (type(exc).__name__, str(exc))


def store_client(cluster: Cluster) -> Any:
    host, port = cluster.store_address
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=30))


def store_dump(cluster: Cluster) -> bytes:
    store = store_client(cluster)
    keys = store.list_keys()
    return b"\n".join(k.encode() + b"=" + bytes(store.get(k)) for k in keys)


def stray_send(cluster: Cluster, token: str | None, rank: int) -> tuple[str, str]:
    """A process-local Collective posing as worker ``rank`` of GROUP sends to rank 0/1."""
    coll = Collective(
        f"{GROUP}:{rank}", store_client(cluster), host="127.0.0.1", timeout=60, job_token=token
    )
    try:
        return (
            "ok",
            repr(
                coll.create_collective_group([f"{GROUP}:{rank}", f"{GROUP}:{rank - 2}"]).send(
                    "from the driver", timeout=60
                )
            ),
        )
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    finally:
        coll.close()


@pytest.fixture
def secret_cluster(ray_session: object) -> Iterator[Cluster]:
    """A Cluster with a known job token, on the session's Ray connection."""
    c = Cluster(num_nodes=1, job_token=SECRET)
    yield c
    c.shutdown()


def run_stray(cluster: Cluster, group: Any, token: str | None, worker: int) -> list[Any]:
    """Worker ``worker`` receives from rank ``worker + 2``, played by a driver Collective."""
    handle = group.execute_on(worker).recv_from(worker + 2)
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(stray_send(cluster, token, worker + 2)))
    t.start()
    got = handle.wait(timeout=120)[0]
    t.join(timeout=120)
    return [got, box[0]]


def test_workers_talk_and_the_token_is_never_in_the_store(secret_cluster: Cluster) -> None:
    group = TokenWorker.create_group().launch(
        secret_cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name=GROUP
    )
    before = group.listeners().wait(timeout=60)
    assert group.talk().wait(timeout=120) == [{"ack": [0, 1, 2, 3]}, [0, 1, 2, 3]]
    # The holder of the job's token may talk to a worker; a guess may not.
    worker_side, stray_side = run_stray(secret_cluster, group, SECRET, 0)
    assert worker_side == ("ok", "'from the driver'")
    assert stray_side == ("ok", "None")
    worker_side, stray_side = run_stray(secret_cluster, group, "a-guess", 1)
    assert worker_side[0] == "AuthenticationError"
    assert "does not hold this job's token" in worker_side[1]
    assert f"peer '{GROUP}:3'" in worker_side[1]
    assert stray_side[0] == "AuthenticationError"
    assert f"peer '{GROUP}:1'" in stray_side[1]
    for message in (worker_side[1], stray_side[1]):
        assert SECRET not in message
    dump = store_dump(secret_cluster)
    assert b"/auth/" in dump
    assert SECRET.encode() not in dump
    # Our listeners (the gloo device; liveness listeners are closed once connected) are
    # on the node IP; the driver's store too.
    after = group.listeners().wait(timeout=60)
    for old, new in zip(before, after, strict=True):
        ours = set(new) - set(old)
        assert ours, "the worker opened no listener of its own"
        assert all(ip == "127.0.0.1" for ip, _ in ours), ours
    store_port = secret_cluster.store_address[1]
    assert [ip for ip, port in listening_sockets() if port == store_port] == ["127.0.0.1"]


def test_a_process_without_the_generated_token_cannot_join(cluster: Cluster) -> None:
    group = TokenWorker.create_group().launch(
        cluster, PackedPlacementStrategy(3, cpus_per_worker=0), name=GROUP
    )
    assert group.execute_on(0, 1).talk().wait(timeout=120) == [{"ack": [0, 1, 2, 3]}, [0, 1, 2, 3]]
    worker_side, stray_side = run_stray(cluster, group, None, 0)
    assert worker_side[0] == "AuthenticationError"
    assert "presented no job token" in worker_side[1]
    assert stray_side[0] == "AuthenticationError"
    assert "holds none" in stray_side[1]


def test_where_the_token_comes_from(ray_session: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("P2P_JOB_TOKEN", raising=False)
    made = [Cluster(num_nodes=1) for _ in range(2)]
    try:
        tokens = [c._job_context().job_token for c in made]
        assert all(t is not None and len(t) == 64 for t in tokens)
        assert tokens[0] != tokens[1]
        context = made[0]._job_context()
        assert tokens[0] not in repr(context)
        assert pickle.loads(pickle.dumps(context)).job_token == tokens[0]
    finally:
        for c in made:
            c.shutdown()
    monkeypatch.setenv("P2P_JOB_TOKEN", "from-env")
    c = Cluster(num_nodes=1)
    explicit = Cluster(num_nodes=1, job_token="explicit")
    try:
        assert c._job_context().job_token == "from-env"
        assert explicit._job_context().job_token == "explicit"
    finally:
        c.shutdown()
        explicit.shutdown()
    with pytest.raises(ValueError, match="job_token"):
        Cluster(num_nodes=1, job_token="")
    with pytest.raises(TypeError, match="job_token"):
        Cluster(num_nodes=1, job_token=b"bytes")  # type: ignore[arg-type]


def test_authentication_error_crosses_ray() -> None:
    err = AuthenticationError("rendezvous at 'p2p/x': peer 'y' does not hold this job's token")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is AuthenticationError
    assert str(back) == str(err)
