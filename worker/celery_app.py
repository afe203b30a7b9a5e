"""The worker's Celery app (`celery -A worker.celery_app worker`, or `torchport worker`).

Configured by `WorkerSettings` with the same policy as the sender (`persistence.queue`);
each worker process keeps one `WorkerContext`: database, store, and one warm sandbox
runner for its lifetime.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from persistence.queue import EXPORT_QUEUES, make_celery
from worker.execution import WorkerContext
from worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

settings = WorkerSettings()
app = make_celery(settings)
app.conf.include = ["worker.tasks"]
if settings.resolved_broker_url.startswith("filesystem://"):
    # The folder broker has no broadcast exchange: remote control would only poll in vain.
    app.conf.worker_enable_remote_control = False

_context: WorkerContext | None = None
_presence: Any = None
_lock = threading.Lock()


def context() -> WorkerContext:
    """This process's worker context, created on first use."""
    global _context
    with _lock:
        if _context is None:
            _context = WorkerContext.create(settings)
        return _context


def runs_exports() -> bool:
    """Whether this worker consumes an export queue (a `webhooks`-only worker never starts
    a sandbox nor describes an environment)."""
    return any(queue in EXPORT_QUEUES for queue in settings.queue_list)


@worker_ready.connect
def _warm_up(**_: Any) -> None:
    global _presence
    if not runs_exports():
        return
    # What the jobs can import (GET /v1/environment): this start's packages replace the
    # record of the last one at once; the import checks, in a fresh interpreter from a
    # thread of this process (never the zygote), fill it in once the sandbox started.
    try:
        from worker.environment import record

        record(context(), cached_only=True)
    except Exception:
        logger.exception("could not describe this worker's environment")
    try:  # alive, busy or idle, for /metrics (persistence.worker_processes)
        from worker.presence import Presence

        _presence = Presence(context())
        _presence.start()
    except Exception:
        logger.exception("could not record this worker's presence")
    # Start the zygote before the first job arrives, so no job pays for `import torch`.
    try:
        context().runner()
    except Exception:
        logger.exception("could not start the sandbox runner; jobs will retry it")
    # Then the checked description.
    try:
        from worker.environment import record_in_background

        record_in_background(context())
    except Exception:
        logger.exception("could not describe this worker's environment")


@worker_shutdown.connect
def _shut_down(**_: Any) -> None:
    global _context, _presence
    if _presence is not None:
        _presence.stop()
        _presence = None
    with _lock:
        if _context is not None:
            _context.close()
            _context = None
