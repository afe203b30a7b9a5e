"""A worker describes its environment at start, for `GET /v1/environment`.

The API runs in another container and never imports torch, so it cannot look: each
worker process, once ready, describes the interpreter its jobs run in
(`engine.environment.libraries`:
package metadata, and each model library imported in a fresh isolated interpreter, never
in this process or the zygote) and records it per queue it consumes.

At start (`worker.celery_app`), `record(cached_only=True)` replaces the record of an
earlier start at once, from package metadata (the import checks only where their answers
for exactly these distributions are kept): after a `pip install` the versions shown are
the new ones from the start, not once the sandbox started and the checks ran (~40 s).
`record_in_background` then records the checked description.
"""

from __future__ import annotations

import logging
import threading

from engine.environment.libraries import describe_environment
from persistence.environments import record_environment
from worker.execution import WorkerContext

logger = logging.getLogger(__name__)


def record(context: WorkerContext, *, check: bool = True, cached_only: bool = False) -> None:
    """Describe this worker's environment and record it for each of its queues
    (`cached_only`: see `engine.environment.libraries.describe_environment`)."""
    description = describe_environment(check=check, cached_only=cached_only)
    for queue in context.settings.queue_list:
        record_environment(
            context.sessions,
            queue=queue,
            hostname=context.settings.worker_name,
            environment=description,
        )
    failing = [lib.name for lib in description.libraries if lib.version and lib.imports is False]
    if failing:
        logger.warning("installed but failing to import in this worker: %s", ", ".join(failing))


def record_in_background(context: WorkerContext) -> threading.Thread:
    """`record` in a daemon thread of this process (the import checks take seconds)."""

    def run() -> None:
        try:
            record(context)
        except Exception:
            logger.warning("could not record this worker's environment", exc_info=True)

    thread = threading.Thread(target=run, name="worker-environment", daemon=True)
    thread.start()
    return thread
