"""A job answered from the cache delivers its webhook (real PostgreSQL, Redis, a
`torchport worker --queues webhooks` process and an HTTP receiver on 127.0.0.1).

Found by an attack run: a submission answered from the cache with a `callback_url` stayed
`webhook.status = "pending"` with 0 attempts forever, even with a webhooks worker
running: only an export worker finishing a job sent the delivery, and a cache hit is
finished by the API without one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from schemas import JobPublic
from service.deps import AppState
from tests.conftest import REDIS_URL
from tests.service.conftest import ROOT, model_file
from tests.service.test_exports import complete
from tests.webhook_receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"cache-hit-secret-of-32-bytes-key").decode()
"""The keyless server's webhook secret (`TORCHPORT_WEBHOOK_SECRET`), as Standard Webhooks
writes one."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiving = Receiver(204, secret=SECRET)  # verifies the Standard Webhooks headers
    yield receiving
    receiving.server.shutdown()


@pytest.fixture
def webhooks_worker(state: AppState, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`torchport worker --queues webhooks` on the test's database and Redis prefix."""
    settings = state.settings
    env = {
        **os.environ,
        "TORCHPORT_DATA_DIR": str(settings.data_dir),
        "TORCHPORT_DATABASE_URL": settings.resolved_database_url,
        "TORCHPORT_BROKER_URL": REDIS_URL,
        "TORCHPORT_BROKER_KEY_PREFIX": settings.broker_key_prefix or "",
        "TORCHPORT_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
        "TORCHPORT_WEBHOOK_SECRET": SECRET,
    }
    with (tmp_path / "webhooks.log").open("ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "torchport.cli", "worker", "--queues", "webhooks"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    yield worker
    if worker.poll() is not None:
        return
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(5)


def test_a_cache_hit_delivers_its_webhook(
    client: TestClient,
    state: AppState,
    tmp_path: Path,
    receiver: Receiver,
    webhooks_worker: subprocess.Popen[bytes],
) -> None:
    first = client.post("/v1/exports", files={"model": model_file()}).json()
    complete(state, first["id"], tmp_path)
    hit = client.post(
        "/v1/exports",
        files={"model": model_file()},
        data={"callback_url": receiver.url},
    )
    assert hit.status_code == 202
    job = JobPublic.model_validate(hit.json())
    assert job.cache_hit and job.status == "succeeded"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not receiver.requests:
        assert webhooks_worker.poll() is None, (tmp_path / "webhooks.log").read_text()
        time.sleep(0.1)
    assert len(receiver.requests) == 1  # was none: pending with 0 attempts forever
    assert receiver.verified == [True]
    sent_headers, body = receiver.requests[0]
    assert JobPublic.model_validate_json(body).id == job.id
    timestamp = sent_headers["X-Torchport-Timestamp"]
    mac = hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    assert sent_headers["X-Torchport-Signature"] == "sha256=" + mac.hexdigest()
    while time.monotonic() < deadline:
        webhook = JobPublic.model_validate(client.get(f"/v1/exports/{job.id}").json()).webhook
        if webhook is not None and webhook.status != "pending":
            break
        time.sleep(0.1)
    assert webhook is not None
    assert (webhook.status, webhook.attempts, webhook.last_status_code) == ("delivered", 1, 204)
