"""Celery tasks: serialization, retries and bookkeeping only; the work is in
`worker.execution` (and the engine, inside the sandbox).

Policy: `acks_late` with prefetch 1 (a task is acknowledged after it ran), task id = job
id, idempotent (a job that is not queued is skipped), retried only for infrastructure
errors (database, store), never for export errors, which end the job.
"""

from __future__ import annotations

import logging

from celery import Task
from sqlalchemy.exc import DBAPIError, OperationalError

from persistence.lifecycle import fail_job
from persistence.models import Job
from persistence.queue import EXPORT_TASK, WEBHOOK_TASK, Queue, enqueue_webhook
from schemas import ErrorBody
from worker.celery_app import app, context, settings
from worker.execution import STORE_ERRORS, execute, release
from worker.webhooks import DeliveryFailed, deliver

logger = logging.getLogger(__name__)

INFRASTRUCTURE_ERRORS = (OperationalError, DBAPIError, *STORE_ERRORS)


@app.task(
    name=EXPORT_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=False,
    max_retries=settings.infra_retries,
    ignore_result=True,
)
def export(self: Task, job_id: str) -> str | None:
    """Run one export job; returns its final status (None when it was not queued)."""
    ctx = context()
    try:
        status = execute(ctx, job_id)
    except INFRASTRUCTURE_ERRORS as exc:
        try:
            release(ctx, job_id)
        except Exception:
            logger.warning("could not release job %s; the reaper will", job_id, exc_info=True)
        if self.request.retries >= (self.max_retries or 0):
            fail_job(
                ctx.sessions,
                job_id,
                ErrorBody(
                    code="internal_error",
                    message="the worker could not reach its database or artifact store",
                    details={"reason": "infrastructure", "type": type(exc).__name__},
                ),
            )
            return "failed"
        raise self.retry(exc=exc, countdown=min(30, 2**self.request.retries)) from exc
    if status is not None:
        with ctx.sessions() as session:
            job = session.get(Job, job_id)
            if job is not None and job.webhook_status == "pending":
                enqueue_webhook(app, job_id)
    return status


@app.task(
    name=WEBHOOK_TASK,
    bind=True,
    acks_late=True,
    queue=Queue.WEBHOOKS.value,
    max_retries=settings.webhook_retries,
    ignore_result=True,
)
def webhook(self: Task, job_id: str) -> bool:
    """Deliver a job's completion callback, retrying with exponential backoff (never to a
    destination that is not public: see `worker.webhooks`)."""
    final = self.request.retries >= (self.max_retries or 0)
    try:
        return deliver(context(), job_id, final_attempt=final)
    except DeliveryFailed as exc:
        delay = settings.webhook_backoff_s * 2**self.request.retries
        raise self.retry(exc=exc, countdown=delay) from exc
