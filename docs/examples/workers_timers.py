"""Timing worker methods: ``with self.worker_timer(tag)`` and ``@Worker.timer(tag)``.

Runs on its own: ``python docs/examples/workers_timers.py``.
"""

from __future__ import annotations

import time

from p2p_worker import Cluster, PackedPlacementStrategy, Worker


class MyWorker(Worker):
    def run_training(self, batch: list[float]) -> float:
        with self.worker_timer("run_training"):  # as a context manager
            return self.train_step(batch)

    @Worker.timer("train_step")  # as a decorator
    def train_step(self, batch: list[float]) -> float:
        time.sleep(0.02 * (self._rank + 1))  # rank 1 is the slow one
        return sum(batch) * (self._rank + 1)


def main() -> None:
    cluster = Cluster(num_nodes=1)
    worker_group = MyWorker.create_group().launch(
        cluster, placement_strategy=PackedPlacementStrategy(2, cpus_per_worker=0), name="timed"
    )
    handle = worker_group.run_training([1.0, 2.0])
    result = handle.wait()
    timing = handle.consume_durations()  # dict: tag -> seconds, max over the ranks
    assert result == [3.0, 6.0]
    assert set(timing) == {"run_training", "train_step"}  # nested tags are included
    assert timing["run_training"] >= timing["train_step"] >= 0.04  # rank 1's time
    assert handle.consume_durations() == {}  # consumed once

    fastest = worker_group.run_training([1.0]).consume_durations("min")
    assert fastest["train_step"] < timing["train_step"]
    print("workers_timers: ok")


if __name__ == "__main__":
    main()
