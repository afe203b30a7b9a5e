"""The Celery app as both sides configure it, and sending jobs by task name.

Torch-free on purpose: the API sends `torchport.export` by name and never imports the
worker's task module. The worker builds its app with the same `make_celery`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from celery import Celery
from kombu import Queue as KombuQueue

from persistence.settings import CommonSettings

EXPORT_TASK = "torchport.export"
WEBHOOK_TASK = "torchport.webhook"


class Queue(StrEnum):
    """Broker queues: `gpu` jobs need a CUDA worker, every other export goes to `cpu`;
    completion callbacks have their own queue, `webhooks`, so that deliveries never wait
    behind exports nor hold an export worker."""

    CPU = "cpu"
    GPU = "gpu"
    WEBHOOKS = "webhooks"


EXPORT_QUEUES = (Queue.CPU.value, Queue.GPU.value)


def queue_for(device: str) -> Queue:
    """The queue a job with this `options.device` goes to."""
    return Queue.GPU if device == "cuda" else Queue.CPU


def broker_options(settings: CommonSettings) -> tuple[str, dict[str, Any]]:
    """Broker URL and transport options; the embedded default is a folder on disk."""
    url = settings.resolved_broker_url
    if url.startswith("filesystem://"):
        folder = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        return url, {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # kombu keeps its exchange tables here; its default is `control` in the
            # current directory, which `torchport serve` must leave alone.
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": settings.broker_polling_interval_s,
        }
    options: dict[str, Any] = {
        # Above the longest job, or Redis hands a running job to a second worker.
        "visibility_timeout": settings.visibility_timeout_s,
        "socket_connect_timeout": 2,
        "socket_timeout": 10,
    }
    if settings.broker_key_prefix:
        options["global_keyprefix"] = settings.broker_key_prefix
    return url, options


def make_celery(settings: CommonSettings) -> Celery:
    """A Celery app with torchport's task policy (see docs/service.md, the job lifecycle)."""
    url, transport_options = broker_options(settings)
    app = Celery("torchport", broker=url, set_as_current=False)
    if url.startswith("filesystem://"):
        app.conf.broker_transport = "persistence.folder_broker:Transport"
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=Queue.CPU.value,
        task_queues=[KombuQueue(q.value, routing_key=q.value) for q in Queue],
        task_create_missing_queues=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        broker_pool_limit=4,
    )
    return app


def enqueue_export(app: Celery, job_id: str, queue: str) -> None:
    """Send one job to its queue; the task id is the job id."""
    app.send_task(
        EXPORT_TASK,
        args=[job_id],
        task_id=job_id,
        queue=queue,
        routing_key=queue,
        retry=True,
        retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.5},
    )


def enqueue_webhook(app: Celery, job_id: str) -> None:
    """Send the completion callback of a job to the `webhooks` queue (with its own retries)."""
    app.send_task(
        WEBHOOK_TASK,
        args=[job_id],
        queue=Queue.WEBHOOKS.value,
        routing_key=Queue.WEBHOOKS.value,
    )


def ping_broker(app: Celery) -> None:
    """Raise unless the broker accepts a connection."""
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, timeout=2)
