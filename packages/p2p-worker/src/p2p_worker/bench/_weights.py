"""``p2p-bench weights``: the RL weight sync, trainer to N rollout workers, every method.

For each link (loopback; an emulated 1 Gbit/s NIC, where a process's links share one
egress) and learning rate, and each number of targets, a trainer group of one and a
rollout group of N are launched; the trainer takes real AdamW steps (fp32 masters, bf16
copy) and after every step each method moves the new version to every rollout worker,
which then checks what it holds against the trainer's checksum (``exact``). The clock
runs from the method's first call until every target holds the version; that check comes
after it (p2p's own per-bucket checks are part of its sync and stay timed). Ray's and gloo's
methods have no emulated link, so they run on loopback only. One record per cell
(method, targets, link, lr) holds the median over the measured steps (the steps after
``--warmup``, where the changed fraction has settled).

Methods: ``p2p-delta`` and ``p2p-full`` (p2p's ``push_weights`` / ``pull_weights``:
a relay through the targets, with and without bit-level deltas; ``p2p-packed``, only
when named: full buckets compressed without loss, ``compress_full=True``), ``sends`` (N full
``Worker.send`` s, RLinf's way), ``ray-object-store``
(``ray.put`` once, N ``ray.get``), ``gloo-broadcast`` (torch.distributed),
``ray-collective-broadcast`` (``ray.util.collective``, gloo) and
``ray-direct-transport`` (an actor method with ``tensor_transport="gloo"``).

``--placement one-node`` (the default) starts every process on node 0. ``--placement
spread`` keeps the trainer there and puts rollout worker ``i`` on node ``1 + i % (N - 1)``
of a cluster of ``N`` nodes (Ray Direct Transport's actors too), so every method crosses
the real network: its only link is ``network`` (no emulation, every method), and the
rendezvous of the gloo methods is on the trainer's node address, at a port free there.
``--link-mbps`` tells the report the rate of that network (see
:mod:`p2p_worker.bench._weights_report`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

import ray
import torch

from p2p_worker import Cluster, PlacementError
from p2p_worker._remote import RemoteMethod
from p2p_worker.bench._jobconfig import ClusterSection, JobConfig
from p2p_worker.bench._model import SHAPES
from p2p_worker.bench._rl_placement import InOrder, layout, pinned
from p2p_worker.bench._weights_actors import (
    PushFacts,
    RdtSource,
    RdtTarget,
    StateRefs,
    VersionFacts,
    WeightsSource,
    WeightsTarget,
)
from p2p_worker.bench._weights_report import (
    JSON_NAME,
    MARKDOWN_NAME,
    PLOT_NAME,
    Record,
    WeightsMeta,
    plot,
    render_markdown,
)

if TYPE_CHECKING:
    from ray.actor import ActorHandle
    from ray.experimental.collective.communicator import CommunicatorHandle

__all__ = ["JSON_NAME", "MARKDOWN_NAME", "PLOT_NAME", "Record", "plot", "render_markdown"]

LINKS = {"loopback": None, "1gbit": 1000.0, "network": None}
"""Link name -> emulated bandwidth in Mbit/s (None: the real link, not emulated).

``network`` is the real network between nodes, the only link of ``--placement spread``."""
PLACEMENTS = ("one-node", "spread")
P2P_METHODS = ("p2p-delta", "p2p-full", "p2p-packed")
"""p2p's weight sync; the delta sync runs first in a step (targets hold the previous version).
``p2p-packed`` is ``p2p-full`` with ``compress_full=True``; it runs only when named."""
BASELINES = (
    "sends",
    "ray-object-store",
    "gloo-broadcast",
    "ray-collective-broadcast",
    "ray-direct-transport",
)
METHODS = P2P_METHODS + BASELINES
DEFAULT_METHODS = tuple(m for m in METHODS if m != "p2p-packed")
LOOPBACK_ONLY = frozenset(BASELINES) - {"sends"}
"""Methods that do not go through p2p's links, so link emulation cannot shape them: they
run on the real links only (``loopback``, ``network``)."""
_cells = itertools.count()


@dataclass
class WeightsOptions:
    """What one run measures."""

    model: str = "qwen2.5-0.5b"
    targets: list[int] = field(default_factory=lambda: [1, 3, 7])
    links: list[str] = field(default_factory=lambda: ["loopback", "1gbit"])
    lrs: list[float] = field(default_factory=lambda: [1e-6, 1e-5])
    steps: int = 8
    warmup: int = 5
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    timeout: float = 600.0
    seed: int = 0
    out: Path = Path("p2p-bench-out")
    address: str | None = None
    placement: str = "one-node"
    link_mbps: float | None = None


QUICK = {
    "model": "small",
    "targets": [1, 3],
    "steps": 4,
    "warmup": 2,
    "methods": ["p2p-delta", "p2p-full", "sends"],
}
"""``--quick``: the small model, 1 and 3 targets, both links, a few steps."""


class RdtSourceHandle(Protocol):
    """A Ray actor handle of :class:`~p2p_worker.bench._weights_actors.RdtSource`."""

    node_ip: RemoteMethod[[], str]
    load: RemoteMethod[[StateRefs], int]
    weights: RemoteMethod[[], dict[str, torch.Tensor]]


class RdtTargetHandle(Protocol):
    """A Ray actor handle of :class:`~p2p_worker.bench._weights_actors.RdtTarget`."""

    node_ip: RemoteMethod[[], str]
    take: RemoteMethod[[ray.ObjectRef[dict[str, torch.Tensor]]], None]
    checksum: RemoteMethod[[], int]


class _Rdt(NamedTuple):
    """Ray Direct Transport's actors of a cell, and their collective group."""

    source: RdtSourceHandle
    targets: list[RdtTargetHandle]
    group: CommunicatorHandle
    actors: list[ActorHandle[object]]
    """The same actors, as Ray's API takes them."""


class CellFacts(VersionFacts):
    """A version's facts with the cell that made it (link, learning rate, targets)."""

    link: str
    lr: float
    targets: int


def job_config(link: str) -> JobConfig:
    """The job's configuration for ``link`` (a shared NIC egress when emulated)."""
    cluster: ClusterSection = {"collective": {"init_timeout": 120.0}}
    mbps = LINKS[link]
    if mbps is not None:
        cluster["net_emulation"] = {"bandwidth_mbps": mbps, "egress": "process"}
    return {"cluster": cluster}


class _Cell:
    """The groups of one (link, lr, targets) block and the methods that run on them."""

    def __init__(
        self, opts: WeightsOptions, link: str, lr: float, targets: int, nodes: Sequence[int]
    ) -> None:
        self.opts = opts
        self.link = link
        self.targets = targets
        self.nodes = tuple(nodes)  # node rank of each target; the trainer is on node 0
        self.cluster = Cluster(config=job_config(link), address=opts.address or "local")
        n = next(_cells)
        self.names = (f"p2p_wbench_src_{n}", f"p2p_wbench_dst_{n}")
        self.src = WeightsSource.create_group(opts.model, lr, opts.seed).launch(
            self.cluster, InOrder([0]), name=self.names[0], timeout=opts.timeout
        )
        self.dst = WeightsTarget.create_group(opts.model).launch(
            self.cluster, InOrder(self.nodes), name=self.names[1], timeout=opts.timeout
        )
        # the gloo rendezvous: the trainer's node address, at a port free there
        self._gloo_addr, self._gloo_port = self.src.call("rendezvous").wait(timeout=opts.timeout)[0]
        self.source_node = str(self._gloo_addr)
        self.target_nodes = [str(ip) for ip in self.dst.call("node_ip").wait(timeout=opts.timeout)]
        self._rdt: _Rdt | None = None

    def step(self) -> VersionFacts:
        facts: VersionFacts = self.src.call("step").wait(timeout=self.opts.timeout)[0]
        return facts

    def run(self, method: str, full_bytes: int) -> tuple[float, int, list[int], tuple[int, int]]:
        """Move the current version with ``method``.

        Returns:
            Seconds, wire bytes, every target's checksum, and for p2p the push's bucket
            count and the buckets the targets read from shared memory (else zeros).
        """
        timeout = self.opts.timeout
        n = self.targets
        lent = (0, 0)
        t0 = time.perf_counter()
        if method in P2P_METHODS:
            sync = method.removeprefix("p2p-")
            recv = self.dst.call("pull_p2p", self.names[0], sync, timeout)
            packed = sync == "packed"
            push = self.src.call("push_p2p", self.names[1], sync, sync == "delta", timeout, packed)
            pushed: PushFacts = push.wait(timeout=timeout)[0]
            wire = int(pushed["sent_bytes"]) + int(pushed["shared_bytes"])  # lent: once
            read: list[int] = recv.wait(timeout=timeout)
            lent = (sum(pushed["modes"].values()), sum(read))
        elif method == "sends":
            recv = self.dst.call("recv_one", self.names[0], timeout)
            serial = LINKS[self.link] is not None  # one shared egress: same total, less memory
            self.src.call("send_all", self.names[1], n, timeout, serial).wait(timeout=timeout)
            recv.wait(timeout=timeout)
            wire = full_bytes * n
        elif method == "ray-object-store":
            refs = self.src.call("put_object").wait(timeout=timeout)[0]
            self.dst.call("get_object", refs).wait(timeout=timeout)
            wire = full_bytes * n
        elif method == "gloo-broadcast":
            args = (self._gloo_addr, self._gloo_port, n + 1, timeout)
            recv = self.dst.call("gloo_broadcast", *args)
            self.src.call("gloo_broadcast", *args).wait(timeout=timeout)
            recv.wait(timeout=timeout)
            wire = full_bytes * n
        elif method == "ray-collective-broadcast":
            recv = self.dst.call("ray_collective_broadcast", n + 1)
            self.src.call("ray_collective_broadcast", n + 1).wait(timeout=timeout)
            recv.wait(timeout=timeout)
            wire = full_bytes * n
        elif method == "ray-direct-transport":
            src, dsts = self._rdt_actors()
            ref = src.weights.remote()
            ray.get([d.take.remote(ref) for d in dsts], timeout=timeout)
            wire = full_bytes * n
        else:
            raise ValueError(f"method: got {method!r}; allowed: {', '.join(METHODS)}")
        seconds = time.perf_counter() - t0
        # What every target holds is checked after the clock stops: the check is the
        # benchmark's, not the method's (p2p's own per-bucket checks stay timed).
        if method == "ray-direct-transport":
            sums = ray.get([d.checksum.remote() for d in self._rdt_actors()[1]], timeout=timeout)
        else:
            sums = self.dst.call("checksum").wait(timeout=timeout)
        return seconds, wire, [int(s) for s in sums], lent

    def _rdt_actors(self) -> tuple[RdtSourceHandle, list[RdtTargetHandle]]:
        if self._rdt is None:
            from ray.experimental.collective import create_collective_group

            src: RdtSourceHandle = RdtSource.options(**pinned(self.cluster, 0)).remote()  # type: ignore[attr-defined]
            dsts: list[RdtTargetHandle] = [
                RdtTarget.options(**pinned(self.cluster, node)).remote(self.opts.model)  # type: ignore[attr-defined]
                for node in self.nodes
            ]
            asked = [src.node_ip.remote(), *(d.node_ip.remote() for d in dsts)]
            where = ray.get(asked, timeout=self.opts.timeout)
            if where != [self.source_node, *self.target_nodes]:
                raise RuntimeError(
                    f"Ray Direct Transport's actors on {where}, not with the workers"
                )
            actors = cast("list[ActorHandle[object]]", [src, *dsts])  # Ray's handles
            group = create_collective_group(actors, backend="torch_gloo")
            self._rdt = _Rdt(src, dsts, group, actors)
        src, dsts = self._rdt.source, self._rdt.targets
        refs: StateRefs = self.src.call("put_object").wait(timeout=self.opts.timeout)[0]
        ray.get(src.load.remote(refs), timeout=self.opts.timeout)  # not timed
        return src, dsts

    def close(self) -> None:
        if self._rdt is not None:
            from ray.experimental.collective import destroy_collective_group

            destroy_collective_group(self._rdt.group)
            for actor in self._rdt.actors:
                ray.kill(actor)
        self.cluster.shutdown()


def run_weights(
    opts: WeightsOptions, say: Callable[[str], None] = print
) -> tuple[list[Record], list[CellFacts]]:
    """Measure every cell; return the records and the per-version facts (changed, loss)."""
    records: list[Record] = []
    versions: list[CellFacts] = []
    base = Cluster(address=opts.address or "local", timeout=opts.timeout)
    try:
        num_nodes = base.num_nodes
        for link in opts.links:
            methods = [
                m
                for m in METHODS  # in this order: p2p-delta first
                if m in opts.methods and (LINKS[link] is None or m not in LOOPBACK_ONLY)
            ]
            for lr in opts.lrs:
                for n in opts.targets:
                    nodes = layout(opts.placement, 1, n, num_nodes).rollouts
                    say(
                        f"[{link} lr={lr:g} targets={n}] launching trainer on node 0 and"
                        f" {n} rollout workers on node(s) {list(nodes)}"
                    )
                    cell = _Cell(opts, link, lr, n, nodes)
                    times: dict[str, list[float]] = {m: [] for m in methods}
                    wires: dict[str, list[int]] = {m: [] for m in methods}
                    exact = dict.fromkeys(methods, True)
                    lent: dict[str, tuple[int, int]] = dict.fromkeys(methods, (0, 0))
                    changed: list[float] = []
                    full = 0
                    try:
                        for step in range(1, opts.steps + 1):
                            facts = cell.step()
                            full = int(facts["full_bytes"])
                            versions.append({"link": link, "lr": lr, "targets": n, **facts})
                            measured = step > opts.warmup
                            if measured:
                                changed.append(float(facts["changed"]))
                            for method in methods:
                                secs, wire, sums, shared = cell.run(method, full)
                                ok = all(s == facts["checksum"] for s in sums)
                                exact[method] = exact[method] and ok
                                if measured:
                                    times[method].append(secs)
                                    wires[method].append(wire)
                                    lent[method] = shared
                                say(
                                    f"  step {step} {method:<26} {secs:8.3f} s"
                                    f"  changed {facts['changed']:.2%}  exact {ok}"
                                    + ("" if measured else "  (warm-up)")
                                )
                    finally:
                        cell.close()
                    for method in methods:
                        if not times[method]:
                            continue
                        records.append(
                            Record(
                                method=method,
                                targets=n,
                                link=link,
                                lr=lr,
                                seconds=statistics.median(times[method]),
                                wire_bytes=int(statistics.median(wires[method])),
                                full_bytes=full,
                                changed=statistics.mean(changed) if changed else 0.0,
                                exact=exact[method],
                                steps=len(times[method]),
                                seconds_each=times[method],
                                source_node=cell.source_node,
                                target_nodes=list(cell.target_nodes),
                                buckets=lent[method][0],
                                lent_buckets=lent[method][1],
                            )
                        )
    finally:
        base.shutdown()
    return records, versions


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``p2p-bench weights``."""
    p = argparse.ArgumentParser(
        prog="p2p-bench weights",
        description="RL weight sync from a trainer to N rollout workers, every method.",
    )
    p.add_argument("--quick", action="store_true", help="small model, 1 and 3 targets, few steps")
    p.add_argument("--model", choices=sorted(SHAPES), help="model shapes (default qwen2.5-0.5b)")
    p.add_argument("--targets", help="comma-separated numbers of rollout workers (default 1,3,7)")
    p.add_argument(
        "--links",
        help="comma-separated: loopback,1gbit (one-node); network (spread, the default there)",
    )
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="one-node",
        help="one-node: every process on node 0; spread: the trainer on node 0, rollout worker"
        " i on node 1 + i %% (nodes - 1) (needs a multi-node cluster, see --address)",
    )
    p.add_argument(
        "--link-mbps",
        type=float,
        help="the real network's rate in Mbit/s: the report holds p2p-delta against 1.5 x"
        " its wire bytes at this rate",
    )
    p.add_argument("--lrs", help="comma-separated learning rates (default 1e-6,1e-5)")
    p.add_argument("--steps", type=int, help="training steps per cell (default 8)")
    p.add_argument("--warmup", type=int, help="steps not measured (default 5)")
    p.add_argument("--methods", help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--out", default="p2p-bench-out", help="output folder")
    p.add_argument("--address", help="Ray address (default: an embedded local cluster)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per operation")
    return p


def options_from(argv: Sequence[str]) -> WeightsOptions:
    """Parse the command line into options (``--quick`` first, explicit flags on top)."""
    args = build_parser().parse_args(list(argv))
    opts = WeightsOptions(out=Path(args.out), address=args.address, timeout=args.timeout)
    opts.placement = args.placement
    if args.placement == "spread":
        opts.links = ["network"]
    if args.quick:
        for key, value in QUICK.items():
            setattr(opts, key, list(value) if isinstance(value, list) else value)
    if args.model:
        opts.model = args.model
    if args.targets:
        opts.targets = _ints(args.targets, "--targets")
    if args.links:
        opts.links = _choices(args.links, LINKS, "--links")
    if args.lrs:
        opts.lrs = [float(x) for x in args.lrs.split(",")]
    if args.steps is not None:
        opts.steps = args.steps
    if args.warmup is not None:
        opts.warmup = args.warmup
    if args.methods:
        opts.methods = _choices(args.methods, METHODS, "--methods")
    if args.link_mbps is not None:
        if args.link_mbps <= 0:
            raise SystemExit(f"--link-mbps: got {args.link_mbps:g}; allowed: a rate > 0")
        opts.link_mbps = args.link_mbps
    real = "network" if opts.placement == "spread" else "loopback"
    wrong = [x for x in opts.links if (x == "network") != (opts.placement == "spread")]
    if wrong:
        raise SystemExit(
            f"--links: got {','.join(wrong)} with --placement {opts.placement}; allowed:"
            + (
                " network (spread crosses the real network, no emulation)"
                if real == "network"
                else " loopback,1gbit (network is the link of --placement spread)"
            )
        )
    if opts.steps <= opts.warmup:
        raise SystemExit(f"--steps ({opts.steps}) must exceed --warmup ({opts.warmup})")
    return opts


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag}: got {text!r}; allowed: comma-separated ints >= 1") from None
    if any(v < 1 for v in values):
        raise SystemExit(f"{flag}: got {text!r}; allowed: comma-separated ints >= 1")
    return values


def _choices(text: str, allowed: Collection[str], flag: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise SystemExit(f"{flag}: got {text!r}; allowed: {', '.join(allowed)}")
    return values


def main(argv: Sequence[str]) -> int:
    """Run ``p2p-bench weights``; write JSON, Markdown and PNG; return the exit code."""
    opts = options_from(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        records, versions = run_weights(opts)
    except PlacementError as exc:  # --placement spread on a one-node cluster
        print(f"p2p-bench weights: error: {exc}", file=sys.stderr)
        return 2
    meta: WeightsMeta = {
        "command": "p2p-bench weights",
        "model": opts.model,
        "parameters": SHAPES[opts.model].parameter_count(),
        "steps": opts.steps,
        "warmup": opts.warmup,
        "placement": opts.placement,
    }
    if opts.link_mbps:
        meta["link_mbps"] = opts.link_mbps
    meta["wall_s"] = round(time.time() - started, 1)
    meta["out"] = str(opts.out)
    payload = {
        "meta": meta,
        "records": [{**asdict(r), "gbps": r.gbps} for r in records],
        "versions": versions,
    }
    (opts.out / JSON_NAME).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    plot(records, opts.out / PLOT_NAME)
    (opts.out / MARKDOWN_NAME).write_text(render_markdown(records, meta), encoding="utf-8")
    print(render_markdown(records, meta))
    bad = [r for r in records if not r.exact]
    for r in bad:
        print(f"NOT EXACT: {r.method} to {r.targets} target(s) on {r.link}, lr {r.lr:g}")
    return 1 if bad else 0
