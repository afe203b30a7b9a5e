"""Completion callbacks: signed with the key's secret, recorded on the job, retried.

The receivers listen on 127.0.0.1, which deliveries refuse unless the host is allowed
(`TORCHPORT_WEBHOOK_ALLOW_HOSTS`): the `context` here allows it; the refusals themselves
are in test_webhook_destinations.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import update
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from persistence.database import transaction
from persistence.models import ApiKey, Job
from persistence.webhook_secrets import new_secret, signing_key
from service.auth import create_key
from tests.webhook_receiver import Receiver
from tests.worker.test_execution import add_job, public
from worker.execution import WorkerContext
from worker.settings import WorkerSettings
from worker.webhooks import DELIVERY_FAILED, DeliveryFailed, deliver, signature_headers


@pytest.fixture
def context(context: WorkerContext) -> WorkerContext:
    """The worker context, allowed to deliver to this machine's test receivers."""
    context.settings = context.settings.model_copy(update={"webhook_allow_hosts": "127.0.0.1"})
    return context


def finished_job(context: WorkerContext, tmp_path: Path, url: str, owner: str | None) -> str:
    job_id = add_job(context, tmp_path, callback_url=url)
    with transaction(context.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="succeeded", owner_id=owner, webhook_status="pending")
        )
    return job_id


def test_delivery_is_signed_with_the_keys_secret(context: WorkerContext, tmp_path: Path) -> None:
    with transaction(context.sessions) as session:
        key = create_key(session, "hooks")
    assert key.webhook_secret.startswith("whsec_")
    assert len(signing_key(key.webhook_secret)) == 32
    receiver = Receiver(200, secret=key.webhook_secret)  # verifies as a receiver would
    try:
        job_id = finished_job(context, tmp_path, receiver.url, key.id)
        assert deliver(context, job_id, final_attempt=False) is True
        assert receiver.verified == [True]
        headers, body = receiver.requests[0]
        assert headers["webhook-id"] == job_id
        assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
        assert Webhook(key.webhook_secret).verify(body, headers)["id"] == job_id
        # The deprecated headers, as before: keyed with the secret's text.
        assert headers["X-Torchport-Timestamp"] == headers["webhook-timestamp"]
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
    finally:
        receiver.server.shutdown()


def test_a_receiver_with_another_secret_refuses_the_delivery(
    context: WorkerContext, tmp_path: Path
) -> None:
    with transaction(context.sessions) as session:
        key = create_key(session, "hooks")
    receiver = Receiver(200, secret=new_secret())
    try:
        job_id = finished_job(context, tmp_path, receiver.url, key.id)
        with pytest.raises(DeliveryFailed):
            deliver(context, job_id, final_attempt=False)
        assert receiver.verified == [False]
        with pytest.raises(WebhookVerificationError):
            Webhook(new_secret()).verify(receiver.requests[0][1], receiver.requests[0][0])
    finally:
        receiver.server.shutdown()


def test_a_secret_made_before_the_spec_signs_with_its_text(
    context: WorkerContext, tmp_path: Path
) -> None:
    with transaction(context.sessions) as session:
        key = create_key(session, "old")
        old = "o" * 43  # token_urlsafe(32) length, no whsec_ prefix
        session.execute(update(ApiKey).where(ApiKey.id == key.id).values(webhook_secret=old))
    as_spec = "whsec_" + base64.b64encode(old.encode()).decode()
    receiver = Receiver(200, secret=as_spec)
    try:
        job_id = finished_job(context, tmp_path, receiver.url, key.id)
        assert deliver(context, job_id, final_attempt=False) is True
        assert receiver.verified == [True]
        headers, body = receiver.requests[0]
        assert Webhook(old.encode()).verify(body, headers)["id"] == job_id
        mac = hmac.new(
            old.encode(), headers["X-Torchport-Timestamp"].encode() + b"." + body, "sha256"
        )
        assert headers["X-Torchport-Signature"] == f"sha256={mac.hexdigest()}"
    finally:
        receiver.server.shutdown()


def test_keyless_jobs_use_the_server_secret(context: WorkerContext, tmp_path: Path) -> None:
    receiver = Receiver(200, secret=b"w" * 32)  # the worker's TORCHPORT_WEBHOOK_SECRET, as bytes
    try:
        job_id = finished_job(context, tmp_path, receiver.url, None)
        deliver(context, job_id, final_attempt=False)
        assert receiver.verified == [True]
        headers, body = receiver.requests[0]
        expected = hmac.new(
            b"w" * 32, headers["X-Torchport-Timestamp"].encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        assert headers["X-Torchport-Signature"] == f"sha256={expected}"
    finally:
        receiver.server.shutdown()


def test_signing_keys_of_secrets() -> None:
    secret = new_secret()
    assert signing_key(secret) == base64.b64decode(secret.removeprefix("whsec_"))
    assert signing_key("a" * 32) == b"a" * 32
    for bad in ("whsec_" + "not base64!" * 3, "whsec_" + base64.b64encode(b"x" * 23).decode()):
        assert len(bad) >= 32
        with pytest.raises(ValueError):
            signing_key(bad)
        with pytest.raises(ValidationError):
            WorkerSettings(webhook_secret=bad)
    assert WorkerSettings(webhook_secret=secret).webhook_secret == secret
    # The worker's signature is the one the library makes and checks.
    headers = signature_headers(secret, "job-1", int(time.time()), b'{"id": "job-1"}')
    assert Webhook(secret).verify(b'{"id": "job-1"}', headers) == {"id": "job-1"}


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
