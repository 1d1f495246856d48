"""Driver subprocesses of the multinode harness: started in the head namespace, read live.

A driver reports back by printing ``P2PMN-RESULT <json>`` (its result, the last one wins)
and ``P2PMN-EVENT <name>`` (a point a test waits for, e.g. "posted" before a node is
killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from netns_namespaces import NetnsClusterError

RESULT_PREFIX = "P2PMN-RESULT "
EVENT_PREFIX = "P2PMN-EVENT "


@dataclass
class DriverResult:
    """What a driver subprocess left: exit status, output, and its last ``P2PMN-RESULT``."""

    returncode: int
    stdout: str
    stderr: str
    result: Any = None

    def check(self) -> Any:
        """Return the result, or raise NetnsClusterError with the output when the run failed."""
        if self.returncode != 0 or self.result is None:
            raise NetnsClusterError(
                f"driver exited {self.returncode} with result {self.result!r}\n--- stdout (tail)\n"
                f"{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}"
            )
        return self.result


class Driver:
    """A running driver subprocess; its stdout is read line by line as it comes."""

    def __init__(self, argv: list[str], *, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, sink: list[str]) -> None:
        for line in stream:
            with self._cond:
                sink.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_event(self, name: str, *, timeout: float) -> float:
        """Wait for the driver to print ``P2PMN-EVENT <name>``; return when it was seen.

        Raises:
            NetnsClusterError: The driver exited or ``timeout`` passed first.
        """
        want = f"{EVENT_PREFIX}{name}"
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(line.strip() == want for line in self._out):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    self._cond.release()
                    try:
                        res = self.finish(timeout=5)
                    finally:
                        self._cond.acquire()
                    raise NetnsClusterError(f"driver never printed {want!r}: {res.stderr[-3000:]}")
                self._cond.wait(min(left, 0.5))
        return time.time()

    def kill(self) -> None:
        """Kill the driver's whole process group (it runs in its own session)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self, *, timeout: float) -> DriverResult:
        """Wait for the driver to exit (killing it after ``timeout``) and collect its output."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(timeout=10)
            self._err.append(f"\n[netns_cluster] driver killed after {timeout} s\n")
        for t in self._threads:
            t.join(timeout=5)
        out, err = "".join(self._out), "".join(self._err)
        result = None
        for line in out.splitlines():
            if line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX) :])
        return DriverResult(self.proc.returncode, out, err, result)
