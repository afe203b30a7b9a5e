"""A job's record stays small whatever the job writes (real PostgreSQL, through the API).

Found by an attack run: a job emitting 3,000 stage events of 15 KB made a 45 MB job
record served whole on every GET, and a 7 MB exception message was stored and served
whole. The worker writes both through `persistence.lifecycle` (`record_stage`, `finish`), as
here.
"""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from persistence.lifecycle import (
    EVENT_LIMIT_MESSAGE,
    MAX_ERROR_TEXT_BYTES,
    MAX_EVENT_MESSAGE_BYTES,
    MAX_EVENTS_PER_JOB,
    claim,
    fail_job,
    finish,
    record_stage,
)
from schemas import ErrorBody, SourceLocation
from service.deps import AppState
from tests.service.test_exports import submit

MARKER = re.compile(r"… \[truncated (\d+) bytes\]$")


def test_a_flood_of_large_stage_events_is_bounded(client: TestClient, state: AppState) -> None:
    job_id = submit(client).json()["id"]
    assert claim(state.sessions, job_id, "w") is not None
    message = "x" * 15_000
    for i in range(1000):
        record_stage(
            state.sessions,
            job_id,
            "w",
            stage="tracing",
            status="progress",
            fraction=i / 1000,
            message=message,
        )
    assert finish(state.sessions, job_id, "w", status="succeeded", error=None, artifacts=[])
    answer = client.get(f"/v1/exports/{job_id}")
    assert answer.status_code == 200
    assert len(answer.content) < 1_000_000  # was 15 MB (45 MB for 3,000 events)
    stages = answer.json()["stages"]
    assert len(stages) == MAX_EVENTS_PER_JOB + 1  # and the final status is still there
    assert stages[-1]["status"] == "succeeded"
    assert stages[-2]["message"] == EVENT_LIMIT_MESSAGE
    progress = next(s for s in stages if s["status"] == "progress")
    match = MARKER.search(progress["message"])
    assert match is not None
    assert int(match.group(1)) == 15_000 - MAX_EVENT_MESSAGE_BYTES
    assert len(progress["message"].encode()) < MAX_EVENT_MESSAGE_BYTES + 64
    with client.stream("GET", f"/v1/exports/{job_id}/events") as stream:
        text = "".join(stream.iter_text())
    assert text.count("event: stage") == MAX_EVENTS_PER_JOB + 1


def test_a_huge_exception_message_is_stored_truncated(client: TestClient, state: AppState) -> None:
    job_id = submit(client).json()["id"]
    assert claim(state.sessions, job_id, "w") is not None
    huge = "é" * (7 * 2**20 // 2)  # 7 MB of UTF-8
    error = ErrorBody(
        code="model_import_failed",
        message=huge,
        hint=huge,
        location=SourceLocation(file="model.py", line=1, code=huge),
        details={"traceback": huge, "frames": [{"code": "y" * 5000}] * 5000, "n": 3},
    )
    assert finish(state.sessions, job_id, "w", status="failed", error=error, artifacts=[])
    answer = client.get(f"/v1/exports/{job_id}")
    assert answer.status_code == 200
    assert len(answer.content) < 200_000  # was over 7 MB
    stored = answer.json()["error"]
    assert stored["code"] == "model_import_failed"
    for text in (stored["message"], stored["hint"], stored["location"]["code"]):
        match = MARKER.search(text)
        assert match is not None
        assert len(text.encode()) < MAX_ERROR_TEXT_BYTES + 64
        assert len(text.encode()) - len(match.group(0).encode()) + int(match.group(1)) == len(
            huge.encode()
        )
    assert stored["details"]["n"] == 3
    assert MARKER.search(stored["details"]["traceback"])
    assert len(stored["details"]["frames"]) == 51  # 50 and a marker


def test_failing_a_job_bounds_its_error_too(client: TestClient, state: AppState) -> None:
    job_id = submit(client).json()["id"]
    assert fail_job(
        state.sessions, job_id, ErrorBody(code="internal_error", message="z" * 3_000_000)
    )
    stored = client.get(f"/v1/exports/{job_id}").json()["error"]
    assert MARKER.search(stored["message"])
    assert len(stored["message"]) < MAX_ERROR_TEXT_BYTES + 64


def test_small_records_are_kept_as_they_are(client: TestClient, state: AppState) -> None:
    job_id = submit(client).json()["id"]
    assert claim(state.sessions, job_id, "w") is not None
    record_stage(state.sessions, job_id, "w", stage="tracing", status="started", message="hi")
    error = ErrorBody(code="data_dependent", message="m", hint="h", details={"a": [1, 2]})
    assert finish(state.sessions, job_id, "w", status="failed", error=error, artifacts=[])
    job = client.get(f"/v1/exports/{job_id}").json()
    assert job["stages"][2]["message"] == "hi"
    assert ErrorBody.model_validate(job["error"]) == error
