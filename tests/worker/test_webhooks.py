"""Completion callbacks: signed with the key's secret, recorded on the job, retried.

The receivers listen on 127.0.0.1, which deliveries refuse unless the host is allowed
(`TORCHPORT_WEBHOOK_ALLOW_HOSTS`): the `context` here allows it; the refusals themselves
are in test_webhook_destinations.py."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from persistence.database import transaction
from persistence.models import Job
from service.auth import create_key
from tests.webhook_receiver import Receiver
from tests.worker.test_execution import add_job, public
from worker.execution import WorkerContext
from worker.webhooks import DELIVERY_FAILED, DeliveryFailed, deliver


@pytest.fixture
def context(context: WorkerContext) -> WorkerContext:
    """The worker context, allowed to deliver to this machine's test receivers."""
    context.settings = context.settings.model_copy(update={"webhook_allow_hosts": "127.0.0.1"})
    return context


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(200)
    yield r
    r.server.shutdown()


def finished_job(context: WorkerContext, tmp_path: Path, url: str, owner: str | None) -> str:
    job_id = add_job(context, tmp_path, callback_url=url)
    with transaction(context.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="succeeded", owner_id=owner, webhook_status="pending")
        )
    return job_id


def test_delivery_is_signed_with_the_keys_secret(
    context: WorkerContext, tmp_path: Path, receiver: Receiver
) -> None:
    with transaction(context.sessions) as session:
        key = create_key(session, "hooks")
    job_id = finished_job(context, tmp_path, receiver.url, key.id)
    assert deliver(context, job_id, final_attempt=False) is True
    headers, body = receiver.requests[0]
    expected = hmac.new(
        key.webhook_secret.encode(),
        headers["X-Torchport-Timestamp"].encode() + b"." + body,
        hashlib.sha256,
    ).hexdigest()
    assert headers["X-Torchport-Signature"] == f"sha256={expected}"
    assert json.loads(body)["id"] == job_id
    webhook = public(context, job_id).webhook
    assert webhook is not None
    assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("delivered", 1, 200)
    assert deliver(context, job_id, final_attempt=False) is True
    assert len(receiver.requests) == 1  # delivered once, not again


def test_keyless_jobs_use_the_server_secret(
    context: WorkerContext, tmp_path: Path, receiver: Receiver
) -> None:
    job_id = finished_job(context, tmp_path, receiver.url, None)
    deliver(context, job_id, final_attempt=False)
    headers, body = receiver.requests[0]
    expected = hmac.new(
        b"w" * 32, headers["X-Torchport-Timestamp"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert headers["X-Torchport-Signature"] == f"sha256={expected}"


def test_failures_are_retried_then_recorded(context: WorkerContext, tmp_path: Path) -> None:
    failing = Receiver(503)
    try:
        job_id = finished_job(context, tmp_path, failing.url, None)
        with pytest.raises(DeliveryFailed):
            deliver(context, job_id, final_attempt=False)
        assert public(context, job_id).webhook.status == "pending"  # type: ignore[union-attr]
        assert deliver(context, job_id, final_attempt=True) is False
        webhook = public(context, job_id).webhook
        assert webhook is not None
        # An allowed internal host's status code is not shown to the caller.
        assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("failed", 2, None)
        assert webhook.last_error == DELIVERY_FAILED
        assert len(failing.requests) == 2
    finally:
        failing.server.shutdown()
