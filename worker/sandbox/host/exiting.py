"""Jobs whose result is out while their processes are still going away.

A job that said `done` and whose outputs were taken is killed and its result returned
at once (`supervisor.supervise`); tearing down its address space takes ~10 ms more. A
thread per such job waits for the zygote's `exited`, then gives back its slot, cgroups
and staging directory: a job's uid is never handed to another job while a process of it
is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Exiting"]


class Exiting:
    """The threads waiting for finished jobs to be gone."""

    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def wait_then(self, exited: Callable[[], None], release: Callable[[], None], name: str) -> None:
        """In a thread of its own: `exited()` (waits for the exit), then `release()`."""

        def run() -> None:
            try:
                exited()
            finally:
                try:
                    release()
                finally:
                    with self._lock:
                        self._threads.discard(thread)

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for the jobs exiting now; False when some are left after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)
