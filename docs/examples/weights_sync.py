"""A trainer pushes its policy to every rollout worker after each step, in one call each side.

Runs on its own: ``python docs/examples/weights_sync.py``. The trainer keeps fp32
master weights and takes real AdamW steps; three rollout workers hold a bf16 copy (their
dtype decides) and pull each version into their own tensors, in place. The first push
sends every byte once down a chain of the rollout workers; later ones send only what
changed, as bit-level deltas, and every target checks every bucket against the source's
checksum.
"""

from __future__ import annotations

import torch

from p2p_worker import Cluster, PackedPlacementStrategy, Worker


def policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(512, 64), torch.nn.Linear(64, 256), torch.nn.Linear(256, 512)
    )


class Trainer(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = policy()  # fp32 masters
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def train_and_push(self, step: int) -> dict[str, object]:
        tokens = torch.randint(0, 512, (8, 16))
        loss = self.model(tokens[:, :-1]).log_softmax(-1).gather(-1, tokens[:, 1:, None]).mean()
        (-loss).backward()
        self.opt.step()
        self.opt.zero_grad()
        # One call: every rollout worker gets this version (bf16, in place, verified).
        report = self.push_weights(
            self.model, version=step, targets="rollout", bucket_bytes=64 << 10
        )
        return {
            "targets": report.targets,
            "modes": report.modes,
            "sent": report.sent_bytes,
            "full": report.full_bytes,
        }


class Rollout(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.model = policy().to(torch.bfloat16)

    def pull(self) -> int:
        # One call: wait for the next version, apply it, learn which one it is.
        return self.pull_weights(self.model, src_group_name="trainer", src_rank=0)


def main() -> None:
    with Cluster(num_nodes=1) as cluster:
        trainer = Trainer.create_group().launch(
            cluster, PackedPlacementStrategy(1, cpus_per_worker=0), name="trainer"
        )
        rollout = Rollout.create_group().launch(
            cluster, PackedPlacementStrategy(3, cpus_per_worker=0), name="rollout"
        )
        for step in range(1, 4):
            pulls = rollout.pull()
            report = trainer.train_and_push(step).wait(300)[0]
            assert pulls.wait(300) == [step, step, step]
            print(f"step {step}: {report['targets']}")
            print(f"  buckets {report['modes']}, sent {report['sent']} of {report['full']} bytes")
            if step > 1:  # later versions travel as deltas: a fraction of the model
                assert report["sent"] < report["full"] / 2
    print("weights_sync: ok")


if __name__ == "__main__":
    main()
