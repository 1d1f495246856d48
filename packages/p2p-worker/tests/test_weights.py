"""Weight sync between real workers on a local Ray cluster: relay, casts, checks, versions."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from p2p_worker import Cluster, PackedPlacementStrategy, WeightSyncError, Worker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

BUCKET = 8 << 10  # 8 KiB buckets: the small model spans a dozen of them


class Tiny(torch.nn.Module):
    """Tied embedding and head, a frozen parameter, an int buffer, a norm kept in fp32."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(256, 64)
        self.block = torch.nn.Linear(64, 128)
        self.out = torch.nn.Linear(128, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.head = torch.nn.Linear(64, 256, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.rope = torch.nn.Parameter(torch.randn(500), requires_grad=False)  # frozen
        self.register_buffer("steps", torch.zeros(7, dtype=torch.int64))
        self.to(dtype)
        self.norm.float()
        self.steps = self.steps.long()


def set_lending(on: bool) -> None:
    """Take part in same-node sharing or not (``P2P_WEIGHTS_LEND`` in this process)."""
    if on:
        os.environ.pop("P2P_WEIGHTS_LEND", None)
    else:
        os.environ["P2P_WEIGHTS_LEND"] = "0"


class Trainer(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = Tiny(torch.float32)  # fp32 masters

    def step(self, seed: int, touch: list[str]) -> None:
        """Change the named tensors (int buffers count up)."""
        g = torch.Generator().manual_seed(seed)
        sd = self.model.state_dict()
        with torch.no_grad():
            for key in touch:
                t = sd[key]
                if t.is_floating_point():
                    t.add_(torch.randn(t.shape, generator=g) * 0.01)
                else:
                    t.add_(1)

    def push(self, version: int, targets: Any, **kwargs: Any) -> dict[str, Any]:
        report = self.push_weights(self.model, version, targets, **kwargs)
        return {
            "targets": report.targets,
            "modes": report.modes,
            "order": report.order,
            "sent": report.sent_bytes,
            "shared": report.shared_bytes,
            "unshared": report.unshared,
            "full": report.full_bytes,
            "base": report.base_bytes,
        }

    def lend(self, on: bool) -> None:
        set_lending(on)

    def push_failing(self, version: int, **kwargs: Any) -> dict[str, Any]:
        try:
            self.push_weights(self.model, version, timeout=60, **kwargs)
        except WeightSyncError as exc:
            return {"failed": exc.failed, "version": exc.version, "text": str(exc)}
        return {"failed": {}}

    def bad_inputs(self) -> list[str]:
        """Bad arguments: each refused by name before anything is sent."""
        out = []
        for call in (
            lambda: self.push_weights(self.model, "7"),
            lambda: self.push_weights(self.model, 7, bucket_bytes=10),
            lambda: self.push_weights(self.model, 7, fanout=0),
            lambda: self.push_weights(self.model, 7, compress_full="yes"),  # type: ignore[arg-type]
            lambda: self.push_weights(self.model, 7, timeout=-1),
            lambda: self.push_weights([1, 2], 7),
            lambda: self.push_weights(self.model, 7, targets=[]),
            lambda: self.push_weights(self.model, 7, targets="wtrainer:0"),
            lambda: self.pull_weights(self.model, "wtrainer", 0),
        ):
            try:
                call()
            except (TypeError, ValueError) as exc:
                out.append(f"{type(exc).__name__}: {exc}")
        return out

    def push_missing_key(self, version: int) -> str:
        """A model without one of the targets' keys: refused, and the targets are told."""
        partial = {k: v for k, v in self.model.state_dict().items() if k != "out.bias"}
        try:
            self.push_weights(partial, version, timeout=60)
        except ValueError as exc:
            return str(exc)
        return "no error"

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}

    def push_noise(self, version: int) -> dict[str, Any]:
        """Random 16-bit integers, which no codec shrinks, pushed packed if it paid."""
        g = torch.Generator().manual_seed(version)
        self.noise = {"noise": torch.randint(-(1 << 15), 1 << 15, (1 << 14,), generator=g)}
        self.noise["noise"] = self.noise["noise"].to(torch.int16)
        report = self.push_weights(
            self.noise, version, "wrollout", sync="noise", bucket_bytes=BUCKET, compress_full=True
        )
        return {"modes": report.modes, "sent": report.sent_bytes, "full": report.full_bytes}


class Rollout(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = Tiny(torch.bfloat16)  # the targets' dtype decides (norm stays fp32)
        with torch.no_grad():
            for p in self.model.parameters():
                p.zero_()

    def pull(self, use_async: bool = False) -> dict[str, Any]:
        ptrs = {k: v.data_ptr() for k, v in self.model.state_dict().items()}
        if use_async:
            version = self.pull_weights(self.model, "wtrainer", 0, async_op=True).wait(120)
        else:
            version = self.pull_weights(self.model, "wtrainer", 0, timeout=120)
        in_place = ptrs == {k: v.data_ptr() for k, v in self.model.state_dict().items()}
        receiver = self.weight_receiver()
        modes = {} if receiver is None else dict(receiver.last_stats.get("modes", {}))
        return {
            "version": version,
            "in_place": in_place,
            "held": self.weight_version(),
            "modes": modes,
        }

    def pull_failing(self) -> dict[str, Any]:
        try:
            return {"version": self.pull_weights(self.model, "wtrainer", 0, timeout=60)}
        except WeightSyncError as exc:
            return {"torn": exc.torn, "text": str(exc), "held": self.weight_version()}

    def lend(self, on: bool) -> None:
        set_lending(on)

    def pull_noise(self) -> tuple[int, torch.Tensor]:
        noise = self.__dict__.setdefault(
            "noise", {"noise": torch.zeros(1 << 14, dtype=torch.int16)}
        )
        version = self.pull_weights(noise, "wtrainer", 0, sync="noise", timeout=120)
        return version, noise["noise"].clone()

    def corrupt(self, key: str) -> None:
        with torch.no_grad():
            self.model.state_dict()[key].view(-1)[0] += 1

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


def assert_same(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
    assert list(dst) == list(src)
    for key, t in dst.items():
        want = src[key].to(t.dtype)
        assert t.dtype == (torch.int64 if key == "steps" else t.dtype)
        assert torch.equal(t.view(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), key


def sync(trainer: Any, rollout: Any, version: int, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    pulls = rollout.pull(kwargs.pop("use_async", False))
    pushed = trainer.push(version, kwargs.pop("targets", None), **kwargs).wait(180)[0]
    return pushed, pulls.wait(180)


def test_push_to_three_targets_in_place_cast_versioned_and_checked(cluster: Cluster) -> None:
    trainer = Trainer.create_group().launch(
        cluster, PackedPlacementStrategy(1, cpus_per_worker=0), name="wtrainer"
    )
    rollout = Rollout.create_group().launch(
        cluster, PackedPlacementStrategy(3, cpus_per_worker=0), name="wrollout"
    )
    # version 1: everything new, so every bucket travels in full; the targets share the
    # source's node, so they read each bucket from its shared arena
    pushed, pulled = sync(trainer, rollout, 1, targets="wrollout", bucket_bytes=BUCKET)
    assert [p["version"] for p in pulled] == [1, 1, 1]
    assert all(p["in_place"] and p["held"] == 1 for p in pulled)
    assert pushed["targets"] == {f"wrollout:{r}": 1 for r in range(3)}
    assert set(pushed["modes"]) == {"full"}
    assert pushed["modes"]["full"] > 8
    assert pushed["unshared"] == {}
    assert pushed["sent"] == 0  # nothing went through a socket or a ring
    assert pushed["shared"] == pushed["full"]  # the source wrote every byte once
    assert pushed["order"] == ("wrollout:0", "wrollout:1", "wrollout:2")
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
        assert dst["embed.weight"].dtype == torch.bfloat16
        assert dst["norm.weight"].dtype == torch.float32
    # version 2: two tensors change; unchanged buckets do not travel, changed ones as deltas
    # (with sharing off on the source, the targets form a chain, as across nodes)
    trainer.lend(False).wait(60)
    trainer.step(2, ["block.weight", "steps"]).wait(60)
    pushed, pulled = sync(trainer, rollout, 2, use_async=True)
    assert [p["version"] for p in pulled] == [2, 2, 2]
    assert pushed["shared"] == 0
    assert pushed["modes"]["same"] > 0
    assert pushed["modes"]["delta"] > 0
    assert pushed["sent"] < pushed["full"] // 2
    assert pushed["base"] == pushed["full"]  # the delta base: one copy in the targets' dtypes
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
        assert dst["steps"].tolist() == [1] * 7  # int buffers exact
    # version 3: nothing changed; the version still advances, no payload travels
    pushed, pulled = sync(trainer, rollout, 3)
    assert [p["version"] for p in pulled] == [3, 3, 3]
    assert set(pushed["modes"]) == {"same"}
    assert pushed["sent"] == 0
    # the same targets as a tree (fanout 2): wrollout:0 feeds wrollout:1 and wrollout:2
    # version 4: a target's own weights change behind the sync's back; it must notice
    rollout.execute_on(1).corrupt("block.weight").wait(60)
    pulls = rollout.pull_failing()
    failed = trainer.push_failing(4, fanout=2).wait(120)[0]
    trainer.lend(True).wait(60)
    got = pulls.wait(120)
    assert got[0] == {"version": 4}
    assert got[2] == {"version": 4}
    assert got[1]["torn"] is True
    assert got[1]["held"] is None
    for word in ("wrollout:1", "version 4", "checksum", "torn"):
        assert word in got[1]["text"]
    assert list(failed["failed"]) == ["wrollout:1"]
    assert failed["version"] == 4
    # version 5: the next push repairs the torn target; sharing is on again, so a changed
    # bucket is read in full from the source's arena rather than encoded as a delta
    trainer.step(5, ["out.weight"]).wait(60)
    pushed, pulled = sync(trainer, rollout, 5)
    assert [p["version"] for p in pulled] == [5, 5, 5]
    assert set(pushed["modes"]) == {"same", "full"}
    assert pushed["sent"] == 0
    assert 0 < pushed["shared"] < pushed["full"] // 2
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
    # bad input is refused by name and leaves both sides usable
    errors = trainer.bad_inputs().wait(60)[0]
    assert len(errors) == 9, errors
    for text, word in zip(
        errors,
        [
            "version",
            "bucket_bytes",
            "fanout",
            "compress_full",
            "timeout",
            "model",
            "targets",
            "source itself",
            "this worker itself",
        ],
        strict=True,
    ):
        assert word in text, (word, text)
    pulls = rollout.pull_failing()
    assert "'out.bias'" in trainer.push_missing_key(6).wait(120)[0]
    for got in pulls.wait(120):
        assert "refused" in got["text"]
        assert "'out.bias'" in got["text"]
        assert got["held"] == 5  # nothing was touched
    _, pulled = sync(trainer, rollout, 6)
    assert [p["version"] for p in pulled] == [6, 6, 6]
    # delta=False keeps no base: every bucket travels in full, frozen ones included;
    # a target that will not map the arena gets its copy by value, and the report says why
    rollout.execute_on(2).lend(False).wait(60)
    pushed, pulled = sync(trainer, rollout, 7, delta=False)
    assert [p["version"] for p in pulled] == [7, 7, 7]
    assert set(pushed["modes"]) == {"full"}
    assert list(pushed["unshared"]) == ["wrollout:2"]
    assert "P2P_WEIGHTS_LEND=0" in pushed["unshared"]["wrollout:2"]
    assert (pushed["sent"], pushed["shared"]) == (pushed["full"], pushed["full"])
    assert pushed["base"] == 0
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
    rollout.execute_on(2).lend(True).wait(60)
    trainer.step(8, ["out.weight", "embed.weight"]).wait(60)
    pushed, pulled = sync(trainer, rollout, 8, delta=False)
    assert [p["version"] for p in pulled] == [8, 8, 8]
    assert (pushed["sent"], pushed["unshared"]) == (0, {})
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)


class ShardTrainer(Worker):
    """One of two trainer workers, each holding every other key of the model."""

    def __init__(self) -> None:
        super().__init__()
        full = Tiny(torch.float32).state_dict()
        self.part = {k: v.clone() for k, v in list(full.items())[self._rank :: 2]}

    def push(self, version: int) -> dict[str, int | None]:
        report = self.push_weights(
            self.part, version, "wrollout", partial=True, bucket_bytes=BUCKET
        )
        return report.targets

    def part_state(self) -> dict[str, torch.Tensor]:
        return self.part


class ShardRollout(Rollout):
    def pull_shards(self) -> int:
        return self.pull_weights(self.model, "wshard", [0, 1], timeout=120)


def test_sharded_source_fills_the_union_in_parallel(cluster: Cluster) -> None:
    shards = ShardTrainer.create_group().launch(
        cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="wshard"
    )
    rollout = ShardRollout.create_group().launch(
        cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="wrollout"
    )
    for version in (1, 2):
        pulls = rollout.pull_shards()
        pushed = shards.push(version).wait(180)
        assert pulls.wait(180) == [version, version]
        assert pushed == [{"wrollout:0": version, "wrollout:1": version}] * 2
    union: dict[str, torch.Tensor] = {}
    for part in shards.part_state().wait(60):
        union.update(part)
    for dst in rollout.state().wait(60):
        for key, t in dst.items():
            want = union[key].to(t.dtype)
            assert torch.equal(t.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


def test_full_buckets_travel_packed_over_connections(cluster: Cluster) -> None:
    trainer = Trainer.create_group().launch(
        cluster, PackedPlacementStrategy(1, cpus_per_worker=0), name="wtrainer"
    )
    rollout = Rollout.create_group().launch(
        cluster, PackedPlacementStrategy(3, cpus_per_worker=0), name="wrollout"
    )
    # by value down a chain (sharing off), packed: every byte arrives bit-exact, fewer
    # of them travel; the relays forward the packed buckets as they came
    trainer.lend(False).wait(60)
    kw: dict[str, Any] = {"bucket_bytes": BUCKET, "compress_full": True}
    pushed, pulled = sync(trainer, rollout, 1, targets="wrollout", **kw)
    assert [p["version"] for p in pulled] == [1, 1, 1]
    assert [p["modes"] for p in pulled] == [pushed["modes"]] * 3  # forwarded as they came
    assert pushed["modes"]["packed"] >= pushed["modes"].get("full", 0)
    assert set(pushed["modes"]) <= {"packed", "full"}
    assert pushed["sent"] < pushed["full"] * 7 // 8
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
    # compress_full=False: the same push in plain bits
    pushed, pulled = sync(trainer, rollout, 2, delta=False, compress_full=False)
    assert [p["version"] for p in pulled] == [2, 2, 2]
    assert set(pushed["modes"]) == {"full"}
    assert pushed["sent"] == pushed["full"]
    # off is the default
    pushed, _ = sync(trainer, rollout, 3, delta=False)
    assert set(pushed["modes"]) == {"full"}
    # every target torn in one bucket: the source packs that bucket for them (a delta is
    # no use to them), the relays forward it as it came, the rest travels as deltas
    pushed, _ = sync(trainer, rollout, 4, delta=True, compress_full=True)
    rollout.corrupt("out.weight").wait(60)
    pulls = rollout.pull_failing()
    failed = trainer.push_failing(5).wait(120)[0]
    assert sorted(failed["failed"]) == ["wrollout:0", "wrollout:1", "wrollout:2"]
    assert [g.get("version") for g in pulls.wait(120)] == [None, None, None]
    trainer.step(6, ["out.weight", "block.weight"]).wait(60)
    pushed, pulled = sync(trainer, rollout, 6)
    assert [p["version"] for p in pulled] == [6, 6, 6]
    assert pushed["modes"]["delta"] > 0
    assert pushed["modes"]["same"] > 0
    assert pushed["modes"]["packed"] == 1
    assert [p["modes"] for p in pulled] == [pushed["modes"]] * 3
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
    # targets that read the source's shared arena get plain bits there, packing or not
    trainer.lend(True).wait(60)
    trainer.step(7, ["out.weight"]).wait(60)
    pushed, pulled = sync(trainer, rollout, 7, delta=False)
    assert [p["version"] for p in pulled] == [7, 7, 7]
    assert set(pushed["modes"]) == {"full"}
    assert (pushed["sent"], pushed["unshared"]) == (0, {})
    assert pushed["shared"] == pushed["full"]
    src = trainer.state().wait(60)[0]
    for dst in rollout.state().wait(60):
        assert_same(src, dst)
    # buckets that packing does not shrink go plain (and are not packed again)
    trainer.lend(False).wait(60)
    for version in (1, 2):
        pulls = rollout.pull_noise()
        pushed = trainer.push_noise(version).wait(120)[0]
        assert pushed["modes"] == {"full": 4}
        assert pushed["sent"] == pushed["full"] == 1 << 15
        want = torch.randint(
            -(1 << 15), 1 << 15, (1 << 14,), generator=torch.Generator().manual_seed(version)
        ).to(torch.int16)
        for got_version, got in pulls.wait(120):
            assert got_version == version
            assert torch.equal(got, want)
