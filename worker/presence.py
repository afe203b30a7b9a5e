"""An export worker process says it is alive, busy or not, for `/metrics`' worker gauges
(`persistence.worker_processes`): a daemon thread records it every heartbeat interval and
deletes its row when the process stops."""

from __future__ import annotations

import logging
import threading

from persistence.worker_processes import beat, forget
from worker.execution import WorkerContext

logger = logging.getLogger(__name__)


class Presence(threading.Thread):
    """Records this process (`WorkerContext.identity`) every heartbeat interval."""

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(name="worker-presence", daemon=True)
        self.context = context
        self._halt = threading.Event()

    def run(self) -> None:
        settings = self.context.settings
        while True:
            try:
                beat(
                    self.context.sessions,
                    self.context.identity,
                    settings.worker_name,
                    settings.queue_list,
                )
            except Exception:
                # A database hiccup: the next beat tries again (a missed one or two stay
                # within the heartbeat timeout the gauges allow).
                logger.warning("could not record this worker's presence", exc_info=True)
            if self._halt.wait(settings.heartbeat_interval_s):
                return

    def stop(self) -> None:
        """Stop beating and delete this process's row."""
        self._halt.set()
        self.join(timeout=5)
        try:
            forget(self.context.sessions, self.context.identity)
        except Exception:
            logger.warning("could not delete this worker's presence", exc_info=True)
