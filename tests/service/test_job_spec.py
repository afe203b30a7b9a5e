"""One typed job description (`schemas.JobSpec`): what the API validates a form into, what
the row keeps and what a worker claims; the callback URL is the job's, not the options'."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from persistence.lifecycle import claim
from persistence.models import Job
from schemas import ExportOptions, JobPublic, JobSpec
from schemas.limits import ZIP_MAX_UNPACKED_BYTES
from service.deps import AppState
from tests.service.conftest import model_file

HOOK = "https://hooks.example.com/torchport"


def post(client: TestClient, model: tuple[str, bytes] | None = None, **data: str):
    return client.post("/v1/exports", files={"model": model or model_file()}, data=data)


def job_count(state: AppState) -> int:
    with state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_the_callback_url_field_is_the_jobs(client: TestClient, state: AppState) -> None:
    answer = post(client, options=json.dumps({"strict": True}), callback_url=HOOK)
    assert answer.status_code == 202, answer.text
    job = JobPublic.model_validate(answer.json())
    assert job.callback_url == HOOK
    assert job.webhook is not None and job.webhook.status == "pending"
    assert answer.json()["options"]["callback_url"] == HOOK  # echoed where it always was
    claimed = claim(state.sessions, job.id, "test-worker")
    assert claimed is not None
    assert isinstance(claimed.spec, JobSpec)
    assert claimed.spec.callback_url == HOOK
    assert claimed.spec.options == ExportOptions(strict=True)
    assert claimed.spec.uploads.model.name == job.model_name
    with state.sessions() as session:
        row = session.get(Job, job.id)
        assert row is not None
        assert "callback_url" not in json.loads(row.options_json)


def test_the_deprecated_option_is_moved_to_the_job(client: TestClient, state: AppState) -> None:
    answer = post(client, options=json.dumps({"callback_url": HOOK}))
    assert answer.status_code == 202, answer.text
    assert answer.json()["callback_url"] == HOOK
    claimed = claim(state.sessions, answer.json()["id"], "test-worker")
    assert claimed is not None and claimed.spec.callback_url == HOOK
    assert "callback_url" not in claimed.spec.options.model_dump()


def test_the_callback_does_not_change_the_cache_key(client: TestClient, state: AppState) -> None:
    first = post(client, callback_url=HOOK).json()
    second = post(client, options=json.dumps({"callback_url": HOOK + "/other"})).json()
    assert second["id"] == first["id"]  # the same job in flight: one job, not two
    assert job_count(state) == 1


@pytest.mark.parametrize(
    ("data", "field", "error_type"),
    [
        ({"callback_url": "ftp://example.com/x"}, "callback_url", "string_pattern_mismatch"),
        ({"callback_url": "https://x/" + "a" * 2048}, "callback_url", "string_too_long"),
        (
            {"callback_url": HOOK, "options": json.dumps({"callback_url": HOOK + "/2"})},
            "callback_url",
            "value_error",
        ),
        (
            {"options": json.dumps({"callback_url": "nope"})},
            "callback_url",
            "string_pattern_mismatch",
        ),
        ({"options": "[1, 2]"}, "options", "model_type"),
    ],
)
def test_a_bad_callback_is_refused_and_nothing_is_stored(
    client: TestClient, state: AppState, data: dict[str, str], field: str, error_type: str
) -> None:
    answer = post(client, **data)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "invalid_request"
    assert (field, error_type) in {(e["field"], e["type"]) for e in body["details"]["errors"]}
    assert job_count(state) == 0


def test_the_same_callback_in_both_places_is_accepted(client: TestClient) -> None:
    answer = post(client, callback_url=HOOK, options=json.dumps({"callback_url": HOOK}))
    assert answer.status_code == 202, answer.text
    assert answer.json()["callback_url"] == HOOK


def test_a_zip_is_refused_at_upload_by_the_limit_the_engine_unpacks_with(
    client: TestClient, state: AppState
) -> None:
    # Declares 300 MiB unpacked (a sparse member: the zip itself is small): under 64 times
    # the 16 MiB model limit, which the API used to allow, over what a job may unpack.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model.py", "model = None\n")
        with archive.open("data.bin", "w", force_zip64=True) as member:
            chunk = bytes(1 << 20)
            for _ in range(300):
                member.write(chunk)
    data = buffer.getvalue()
    assert len(data) < state.settings.max_model_bytes
    answer = post(client, model=("model.zip", data))
    assert answer.status_code == 400, answer.text
    details = answer.json()["details"]
    assert details["reason"] == "zip_too_large"
    assert details["max_unpacked_bytes"] == ZIP_MAX_UNPACKED_BYTES
    assert job_count(state) == 0
