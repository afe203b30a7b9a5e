"""Completion callbacks: POST the job body to `options.callback_url`, signed.

The signature is `X-Torchport-Signature: sha256=<hex>` where the hex is
HMAC-SHA256(secret, f"{timestamp}.{body}") and the timestamp is sent as
`X-Torchport-Timestamp`; the secret is the submitting API key's webhook secret
(shown by `torchport keys create`), or `TORCHPORT_WEBHOOK_SECRET` for keyless servers.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import httpx
from sqlalchemy import update

from service.database import transaction
from service.jobs import load_job, to_public
from service.models import ApiKey, Job, utcnow
from worker.execution import WorkerContext


class DeliveryFailed(Exception):
    """The receiver did not answer 2xx; retried with backoff."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header value for a body sent at `timestamp`."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def deliver(context: WorkerContext, job_id: str, *, final_attempt: bool) -> bool:
    """Send one delivery attempt and record it on the job; True when delivered (or moot).

    Raises:
        DeliveryFailed: the attempt failed and another will follow.
    """
    with context.sessions() as session:
        job = load_job(session, job_id)
        if job is None or job.webhook_status in (None, "delivered"):
            return True
        public = to_public(job)
        secret = context.settings.webhook_secret
        if job.owner_id is not None:
            key = session.get(ApiKey, job.owner_id)
            secret = key.webhook_secret if key is not None else None
    url = public.options.callback_url
    if url is None:
        return True
    body = public.model_dump_json().encode("utf-8")
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-Torchport-Timestamp": timestamp,
        "X-Torchport-Job": job_id,
    }
    if secret:
        headers["X-Torchport-Signature"] = sign(secret, timestamp, body)
    status_code: int | None = None
    error: str | None = None
    try:
        answer = httpx.post(
            url,
            content=body,
            headers=headers,
            timeout=context.settings.webhook_timeout_s,
            follow_redirects=False,
        )
        status_code = answer.status_code
        if not 200 <= answer.status_code < 300:
            error = f"HTTP {answer.status_code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    delivered = error is None
    with transaction(context.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                webhook_attempts=Job.webhook_attempts + 1,
                webhook_last_status_code=status_code,
                webhook_last_error=error,
                webhook_status="delivered"
                if delivered
                else ("failed" if final_attempt else "pending"),
                webhook_delivered_at=utcnow() if delivered else None,
            )
        )
    if not delivered and not final_attempt:
        raise DeliveryFailed(error)
    return delivered
