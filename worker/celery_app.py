"""The worker's Celery app (`celery -A worker.celery_app worker`, or `torchport worker`).

Configured by `WorkerSettings` with the same policy as the sender (`service.queue`);
each worker process keeps one `WorkerContext`: database, store, and one warm sandbox
runner for its lifetime.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from service.queue import make_celery
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
_lock = threading.Lock()


def context() -> WorkerContext:
    """This process's worker context, created on first use."""
    global _context
    with _lock:
        if _context is None:
            _context = WorkerContext.create(settings)
        return _context


@worker_ready.connect
def _warm_up(**_: Any) -> None:
    # Start the zygote before the first job arrives, so no job pays for `import torch`.
    try:
        context().runner()
    except Exception:
        logger.exception("could not start the sandbox runner; jobs will retry it")


@worker_shutdown.connect
def _shut_down(**_: Any) -> None:
    global _context
    with _lock:
        if _context is not None:
            _context.close()
            _context = None
