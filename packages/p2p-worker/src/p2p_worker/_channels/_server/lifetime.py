"""How a channel worker ends with its job: it watches the job's rendezvous store."""

from __future__ import annotations

import logging
import os
import socket
import threading

import ray

from p2p_worker._runtime._state import JobContext

logger = logging.getLogger(__name__)

WATCH_PERIOD = 2.0  # seconds between checks that the job's rendezvous store is alive


def watch_store(job: JobContext, stop: threading.Event) -> None:
    """Stop this actor once the job's rendezvous store is gone (the job has ended).

    A plain TCP connect probes the store (a store client would log a C++ trace on
    every failed request); two refusals in a row end the actor.
    """
    misses = 0
    while not stop.wait(WATCH_PERIOD):
        try:
            with socket.create_connection((job.store_host, job.store_port), timeout=5.0):
                misses = 0
        except OSError:
            misses += 1
            if misses >= 2:
                logger.info("channel worker: the job's rendezvous store is gone; stopping")
                _stop_self()
                return


def _stop_self() -> None:
    try:
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
    except Exception:  # pragma: no cover - Ray already tearing down
        os._exit(0)
