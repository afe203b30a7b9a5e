"""A group of worker processes started and watched by `torchport serve` / `torchport worker`.

A worker that dies (kill -9, out of memory) is started again; its job is re-queued by
the API's lost-job recovery.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


class WorkerGroup:
    """`count` processes of `torchport worker --concurrency 1`, restarted when they die."""

    def __init__(self, count: int, env: dict[str, str] | None = None, loglevel: str = "WARNING"):
        self.count = count
        self.env = {**os.environ, **(env or {})}
        self.loglevel = loglevel
        self.processes: list[subprocess.Popen[bytes]] = []
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "torchport.cli",
            "worker",
            "--concurrency",
            "1",
            "--loglevel",
            self.loglevel,
        ]
        # Its own process group, so stopping the group also stops the sandbox zygote; and
        # it dies with us, so a killed `torchport serve` leaves no orphaned workers.
        return subprocess.Popen(
            command, env=self.env, start_new_session=True, preexec_fn=_die_with_parent
        )

    def start(self) -> None:
        """Start the processes and a thread that restarts the ones that exit."""
        self.processes = [self._spawn() for _ in range(self.count)]
        self._watcher = threading.Thread(target=self._watch, name="worker-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopping.wait(1.0):
            for index, process in enumerate(self.processes):
                if process.poll() is not None and not self._stopping.is_set():
                    logger.warning(
                        "worker %d exited with %s; starting another",
                        process.pid,
                        process.returncode,
                    )
                    self.processes[index] = self._spawn()

    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [p.pid for p in self.processes]

    def stop(self, grace_s: float = 10.0) -> None:
        """Ask every worker to stop (SIGTERM), then kill what is left after `grace_s`."""
        self._stopping.set()
        for process in self.processes:
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        if self._watcher is not None:
            self._watcher.join(timeout=2)

    def wait(self) -> int:
        """Block until stopped from elsewhere (or every worker is gone); returns 0."""
        try:
            while not self._stopping.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        return 0


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
