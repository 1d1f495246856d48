"""What the peers' own test suites are, and which of their cases are expected to fail.

The data of ``tools/peer_suites.py``: where each peer keeps its files, the import lines
the runner swaps, the one fixture edit it makes, the cases known to fail on p2p (each
with its reason) and what ``--ci`` runs.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    """Where a peer keeps its files and how the runner lays them out."""

    name: str
    files: tuple[str, ...]  # paths relative to the suite's folder, copied as they are laid
    shared_dir: str  # folder under ../shared/peer-suites
    checkout_dir: str  # folder inside a checkout of the peer's repository
    peer_passes: int  # cases the peer itself passes on a 2-core CPU machine
    peer_total: int
    rewrites: tuple[tuple[str, str], ...]  # (regex on one import line, replacement)


# Ray's conftest.py is not laid out: it imports Ray's NCCL module at the top, which needs
# CuPy, and the one fixture these files take from it (``ray_start_single_node``: a local
# ``ray.init(num_cpus=8)``, shut down after the case) comes from the runner's plugin.
RAY_FILES = (
    "cpu_util.py",
    *(
        f"single_node_cpu_tests/test_{n}.py"
        for n in (
            "allgather",
            "allreduce",
            "basic_apis",
            "broadcast",
            "gloo_group_isolation",
            "reduce",
            "reducescatter",
            "sendrecv",
        )
    ),
)

SUITES = {
    "ray": Suite(
        name="ray",
        files=RAY_FILES,
        shared_dir="ray-collective",
        checkout_dir="python/ray/util/collective/tests",
        peer_passes=157,
        peer_total=159,
        rewrites=(
            (
                r"^(\s*)import ray\.util\.collective as (\w+)\s*$",
                r"\1import p2p_worker.compat as \2",
            ),
            (
                r"^(\s*)from ray\.util\.collective\.types import",
                r"\1from p2p_worker.compat.types import",
            ),
            # cpu_util.py sits beside the tests' folder in the copy (Ray's wheel lacks it).
            (
                r"^(\s*)from ray\.util\.collective\.tests\.cpu_util import",
                r"\1from cpu_util import",
            ),
        ),
    ),
    "rlinf": Suite(
        name="rlinf",
        files=("test_worker.py", "test_channel.py", "test_comm.py"),
        shared_dir="rlinf-scheduler",
        checkout_dir="tests/unit_tests",
        peer_passes=143,
        peer_total=143,
        rewrites=(
            (
                r"^(\s*)from rlinf\.scheduler\.collective(\.[\w.]+)? import",
                r"\1from p2p_collective import",
            ),
            (r"^(\s*)from rlinf\.scheduler(\.[\w.]+)? import", r"\1from p2p_worker import"),
        ),
    ),
}

# The one edit that is not an import line: RLinf's module-scoped ``channel`` fixture asks
# for both channels, so every case builds the distributed one (three channel workers on
# one node, through RLinf's private ``Channel._initialize``). The edit asks for the
# distributed channel only in the cases that use it. Printed by the runner.
FIXTURE_EDITS = {
    "test_channel.py": (
        "def channel(channel_type, regular_channel, distributed_channel):\n"
        '    """Select channel based on channel_type parameter from test function."""\n'
        '    if channel_type == "distributed":\n'
        "        return distributed_channel\n",
        "def channel(channel_type, regular_channel, request):\n"
        '    """Select channel based on channel_type parameter from test function."""\n'
        '    if channel_type == "distributed":\n'
        '        return request.getfixturevalue("distributed_channel")\n',
    ),
}

_RLINF_MCPG = "test_comm.py::TestMultiChannelProcessGroupFailures::"

# Cases expected to fail on p2p, with the reason. ``--check`` fails on any other failure.
KNOWN_FAILURES = {
    "ray": {
        "test_basic_apis.py::test_destroy_group": (
            "fails on Ray too: re-initialises the group with the default backend (NCCL), "
            "which needs a GPU"
        ),
        "test_gloo_group_isolation.py::test_failure_when_initializing": (
            "fails on Ray too: calls ray.init() while the module's shared Ray is up"
        ),
        "test_gloo_group_isolation.py::test_two_groups_in_one_cluster": (
            "checks isinstance against Ray's internal TorchGLOOGroup and reads its private "
            "gloo context; see docs/concepts/ray-collective.rst"
        ),
    },
    "rlinf": {
        _RLINF_MCPG + "test_recv_propagates_process_group_failure": (
            "builds MultiChannelProcessGroup with object.__new__ and plants fake torch process "
            "groups in RLinf's private _recv_gloo_process_groups; p2p's channels are p2p pair "
            "groups (sizes checked, peer death seen), not lists of torch process groups. The "
            "behaviour it checks (a failure is logged once and raised unchanged) is p2p's "
            "too: packages/p2p-collective/tests/test_multi_channel.py"
        ),
        _RLINF_MCPG + "test_recv_propagates_synchronous_wait_failure": (
            "as test_recv_propagates_process_group_failure: plants a fake torch process group "
            "in RLinf's private _recv_gloo_process_groups"
        ),
        "test_channel.py::TestChannel::test_distributed_channel_creation": (
            "RLinf's distributed channel (one channel worker per node, keys routed by rank "
            "0's ensure_key_replica), built through its private Channel() / _initialize / "
            "_channel_actors_by_rank: p2p has no channel over several channel workers (a "
            "ChannelWorker group of more than one is refused); see docs/migration-rlinf.rst. "
            "The same cases' regular-channel twins pass"
        ),
        "test_channel.py::TestChannel::test_channel_worker_routing": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        "test_channel.py::TestChannel::test_channel_worker_isolation": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        "test_channel.py::TestChannel::test_channel_worker_rank_assignment": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        "test_channel.py::TestChannel::test_channel_worker_selection": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        # Every parametrization of a test whose channel_type is "distributed" (the regular
        # twin of each, same test and parameters otherwise, is expected to pass).
        "test_channel.py::TestChannel::*[*distributed]": (
            "the distributed variant of a channel test: RLinf's distributed channel (several "
            "channel workers, built through its private Channel._initialize), which p2p "
            "does not have; the regular variant of the same case runs and passes"
        ),
    },
}

# What ``--ci`` runs (``nox -s ci``), per suite: RLinf's three files whole, and of Ray's
# 159 cases the first case of each file that is not a known failure (7 cases: allgather,
# allreduce, init, broadcast, reduce, reducescatter, send/recv, each on read-only arrays
# from Ray's object store). Each Ray case starts a Ray of its own (15-20 s on a 2-core
# machine), so the whole suite (about 50 minutes there) stays out of ci; `nox -s peers`
# runs it.
CI_SUBSETS: dict[str, str | None] = {"ray": "files", "rlinf": None}


def known_reason(suite: Suite, case_id: str) -> str | None:
    """The reason a failing case is expected to fail, if it is listed.

    A key without ``[`` names a test with all its parametrizations; a key with ``[`` is
    an ``fnmatch`` pattern over the whole case id (``*[*distributed]``).
    """
    base = case_id.split("[", 1)[0]
    table = KNOWN_FAILURES[suite.name]
    if base in table:
        return table[base]
    for key, reason in table.items():
        if "[" in key and fnmatch.fnmatchcase(case_id, key.replace("[", "[[]", 1)):
            return reason
    return None
