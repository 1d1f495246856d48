"""The p2p method: a sender and a receiver worker group per job configuration.

A codec and a link profile are job-level settings (``cluster.collective.
tensor_compression`` and ``cluster.net_emulation``), so every (codec, link) block gets
its own :class:`p2p_worker.Cluster` object carrying that configuration. All of them
share the one Ray connection of the process (opened by the first, configuration-free
Cluster of the run), so a block costs two worker launches, not a Ray start.

Nothing is assumed about what the installed stack does with a setting: before the
first block of a codec is measured, a probe sends a highly compressible tensor and
reads the transport's own byte counters (a codec that is accepted but not applied
shows up as wire bytes >= payload bytes); before the first emulated link, a probe job
on a slow emulated link checks that the transfer takes the time that link needs. A
setting that fails its probe is reported as unavailable, with the evidence, and none
of its cells is measured.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from p2p_collective import CollectiveGroup
from p2p_worker import Cluster, NodePlacementStrategy, Worker, WorkerAddress, WorkerGroup
from p2p_worker.bench._jobconfig import JobConfig, job_config
from p2p_worker.bench._payloads import Payload, payload_nbytes
from p2p_worker.bench._results import Sample, samples_from_timings
from p2p_worker.bench._spec import Cell, LinkProfile, format_size
from p2p_worker.bench._timing import PayloadCache, receiver_loop, sender_loop

PROBE_BYTES = 1 << 20
EMULATION_PROBE_MBPS = 8.0
_counter = itertools.count()


def _probe_payload() -> torch.Tensor:
    """1 MiB of int64 values below 251: any codec shrinks it several times."""
    return torch.arange(PROBE_BYTES // 8, dtype=torch.int64) % 251


class SendCounters(TypedDict):
    """The counters of a group's ``send`` direction that a transfer is measured with."""

    messages: int
    wire_bytes: int
    payload_bytes: int


class BenchEndpoint(Worker):
    """One end of the p2p method (a worker of a one-worker group); also runs the probes.

    The sender calls ``Worker.send`` with the payload and waits for the receiver's
    one-element acknowledgement (``send_tensor``/``recv_tensor``, no header).
    """

    def __init__(self) -> None:
        super().__init__()
        self._cache = PayloadCache()
        self._ack = torch.zeros(1, dtype=torch.int64)

    def _send_stats(self, peer: str) -> SendCounters:
        me = self.worker_address
        group = self.collective.create_collective_group([me, WorkerAddress(peer, 0)])
        if not isinstance(group, CollectiveGroup):  # two members make a pair
            raise TypeError(f"expected the pair's CollectiveGroup, got {type(group).__name__}")
        send = group.stats()["send"]

        def counter(name: str) -> int:
            value = send[name]
            if not isinstance(value, int):
                raise TypeError(f"stats()['send'][{name!r}]: got {value!r}, not an int counter")
            return value

        return {
            "messages": counter("messages"),
            "wire_bytes": counter("wire_bytes"),
            "payload_bytes": counter("payload_bytes"),
        }

    def _run_sender(self, peer: str, payload: Payload, reps: int) -> tuple[list[float], int, int]:
        before = self._send_stats(peer)
        secs = sender_loop(
            lambda: self.send(payload, peer, 0),
            lambda: self.recv_tensor(self._ack, peer, 0),
            reps,
        )
        after = self._send_stats(peer)
        sent = max(1, after["messages"] - before["messages"])
        wire = (after["wire_bytes"] - before["wire_bytes"]) // sent
        logical = (after["payload_bytes"] - before["payload_bytes"]) // sent
        return secs, int(wire), int(logical)

    def _run_receiver(self, peer: str, expected: Payload, reps: int, what: str) -> None:
        receiver_loop(
            lambda: self.recv(peer, 0),
            lambda: self.send_tensor(self._ack, peer, 0),
            reps,
            expected,
            what,
        )

    def p2p_send(self, peer: str, kind: str, size: int, reps: int) -> tuple[int, list[float], int]:
        """Sender side of a cell: ``(payload bytes, seconds per rep, wire bytes per send)``."""
        payload = self._cache.get(kind, size)
        secs, wire, _ = self._run_sender(peer, payload, reps)
        return payload_nbytes(payload), secs, wire

    def p2p_recv(self, peer: str, kind: str, size: int, reps: int) -> None:
        """Receiver side of a cell (checks the warm-up payload bit for bit)."""
        self._run_receiver(peer, self._cache.get(kind, size), reps, f"p2p {kind} {size}")

    def probe_send(self, peer: str) -> tuple[float, int, int]:
        """Send the probe once: ``(seconds, wire bytes, payload bytes)``."""
        secs, wire, logical = self._run_sender(peer, _probe_payload(), 1)
        return secs[0], wire, logical

    def probe_recv(self, peer: str) -> None:
        """Receive the probe."""
        self._run_receiver(peer, _probe_payload(), 1, "probe")


@dataclass
class P2PSession:
    """The Ray connection of a run and where the two ends of every method live.

    Attributes:
        base: the configuration-free Cluster that owns the Ray connection.
        address: the Ray address given on the command line, ``None`` for embedded.
        description: one line for the report.
        sender_rank / receiver_rank: node ranks of the two ends.
        sender_node / receiver_node: the same nodes as Ray node ids (for the baselines).
        emulation_gap / codec_gaps: probe verdicts, ``None`` when the feature works.
    """

    base: Cluster
    address: str | None
    description: str
    sender_rank: int = 0
    receiver_rank: int = 0
    sender_node: str | None = None
    receiver_node: str | None = None
    emulation_checked: bool = False
    emulation_gap: str | None = None
    codec_gaps: dict[str, str | None] = field(default_factory=dict)

    @property
    def real_link(self) -> str:
        """The unemulated link the two ends use: ``loopback`` or ``<ip> -> <ip>``."""
        nodes = self.base.nodes
        if self.sender_rank == self.receiver_rank:
            return "loopback" if nodes[self.sender_rank].ip.startswith("127.") else "one node"
        return f"{nodes[self.sender_rank].ip} -> {nodes[self.receiver_rank].ip}"

    def close(self) -> None:
        """Shut the base cluster down (and Ray with it when it was embedded)."""
        self.base.shutdown()


def open_cluster(address: str | None, *, timeout: float) -> P2PSession:
    """Start an embedded local Ray cluster (``address=None``) or attach to ``address``.

    With two or more nodes the sender runs on node 0 (the driver's) and the receiver on
    node 1, so every method crosses the real network; with one node both share it.
    """
    base = Cluster(address=address or "local", timeout=timeout)
    nodes = base.nodes
    receiver = 1 if len(nodes) > 1 else 0
    where = "embedded local Ray (127.0.0.1)" if base.is_embedded else f"Ray at {address}"
    return P2PSession(
        base=base,
        address=address,
        description=f"{where}, {len(nodes)} node(s), {base.num_cpus:g} CPUs",
        sender_rank=0,
        receiver_rank=receiver,
        sender_node=nodes[0].ray_node_id,
        receiver_node=nodes[receiver].ray_node_id,
    )


class P2PJob:
    """One p2p job: a Cluster object with the job's configuration and its two groups.

    Constructing it validates the configuration (cheap); :meth:`launch` starts the two
    one-worker groups (seconds), and may run in a thread next to other launches.
    """

    def __init__(self, session: P2PSession, config: JobConfig, timeout: float) -> None:
        self.timeout = timeout
        self.cluster = Cluster(config=config, address=session.address or "local")
        n = next(_counter)
        self.names = (f"p2p_bench_send_{n}", f"p2p_bench_recv_{n}")
        self._ranks = (session.sender_rank, session.receiver_rank)
        self._snd: WorkerGroup[BenchEndpoint] | None = None
        self._rcv: WorkerGroup[BenchEndpoint] | None = None

    def launch(self) -> P2PJob:
        """Start the sender and the receiver group (at once); return this job.

        Raises:
            p2p_worker.WorkerError: A worker failed to start.
        """

        def one(i: int) -> WorkerGroup[BenchEndpoint]:
            return BenchEndpoint.create_group().launch(
                self.cluster,
                NodePlacementStrategy([self._ranks[i]], cpus_per_worker=0),
                name=self.names[i],
                timeout=self.timeout,
            )

        with ThreadPoolExecutor(2, thread_name_prefix="p2p-bench-launch") as pool:
            futures = [pool.submit(one, i) for i in (0, 1)]
            self._snd, self._rcv = (f.result() for f in futures)
        return self

    @property
    def snd(self) -> WorkerGroup[BenchEndpoint]:
        """The sender's group.

        Raises:
            RuntimeError: The job was not launched (:meth:`launch`).
        """
        if self._snd is None:
            raise RuntimeError("P2PJob: call launch() first")
        return self._snd

    @property
    def rcv(self) -> WorkerGroup[BenchEndpoint]:
        """The receiver's group.

        Raises:
            RuntimeError: The job was not launched (:meth:`launch`).
        """
        if self._rcv is None:
            raise RuntimeError("P2PJob: call launch() first")
        return self._rcv

    def probe(self) -> tuple[float, int, int]:
        """Send the probe tensor once: ``(seconds, wire bytes, payload bytes)``."""
        recv = self.rcv.call("probe_recv", self.names[0])
        send = self.snd.call("probe_send", self.names[1])
        secs, wire, logical = send.wait(timeout=self.timeout)[0]
        recv.wait(timeout=self.timeout)
        return float(secs), int(wire), int(logical)

    def run_cell(self, cell: Cell, reps: int) -> list[Sample]:
        """Measure one cell."""
        recv = self.rcv.call("p2p_recv", self.names[0], cell.kind, cell.size, reps)
        send = self.snd.call("p2p_send", self.names[1], cell.kind, cell.size, reps)
        nbytes, secs, wire = send.wait(timeout=self.timeout)[0]
        recv.wait(timeout=self.timeout)
        return samples_from_timings(cell, nbytes, secs, wire_bytes=wire)

    def close(self) -> None:
        """Shut the groups and this Cluster object down (the Ray connection stays)."""
        self.cluster.shutdown()


def emulation_probe_job(session: P2PSession, timeout: float) -> P2PJob:
    """The (not yet launched) probe job of :func:`check_emulation`: raw, 8 Mbit/s."""
    probe_link = LinkProfile("probe", EMULATION_PROBE_MBPS * 1e6)
    return P2PJob(session, job_config("raw", probe_link), timeout)


def check_emulation(session: P2PSession, job: P2PJob) -> str | None:
    """Whether ``cluster.net_emulation`` really paces sends; the verdict is kept per run.

    ``job`` is a launched :func:`emulation_probe_job`: its 1 MiB probe must take at
    least half the time its wire bytes need on an 8 Mbit/s link. The job is closed.

    Returns:
        ``None`` when emulation works, else the reason with the measured evidence.
    """
    try:
        secs, wire, _ = job.probe()
    finally:
        job.close()
    gap = emulation_gap(secs, wire, EMULATION_PROBE_MBPS)
    session.emulation_checked, session.emulation_gap = True, gap
    return gap


def emulation_gap(seconds: float, wire_bytes: int, mbps: float) -> str | None:
    """Verdict of the link probe: ``None`` when the transfer took at least half its wire time.

    Example:
        >>> emulation_gap(1.1, 1 << 20, 8.0) is None
        True
        >>> emulation_gap(0.002, 1 << 20, 8.0)[:40]
        'cluster.net_emulation is accepted, but 1'
    """
    floor = wire_bytes * 8 / (mbps * 1e6)
    if seconds >= 0.5 * floor:
        return None
    return (
        f"cluster.net_emulation is accepted, but {format_size(wire_bytes)} on an emulated "
        f"{mbps:g} Mbit/s link took {seconds * 1e3:.1f} ms where the link needs "
        f"{floor * 1e3:.0f} ms: the installed p2p_collective does not pace sends yet"
    )


def codec_gap(codec: str, wire: int, logical: int) -> str | None:
    """Verdict of the codec probe: ``None`` when the probe went on the wire in fewer bytes.

    Example:
        >>> codec_gap("lz4", 5000, 1 << 20) is None
        True
    """
    if wire < logical:
        return None
    return (
        f"cluster.collective.tensor_compression ({codec}) is accepted, but the installed "
        f"p2p_collective sent a {format_size(logical)} tensor of small int64 values as "
        f"{wire} wire bytes: no compression on the wire yet"
    )
