"""The jobs list returns summaries bounded in bytes (real PostgreSQL and Redis).

Found by an attack run: 100 jobs filled to the record bound (200 stage events of 2 KiB, an
error at its bounds), then `GET /v1/exports?limit=100` from 4 threads: each answer was
40 MiB (every job whole, events and error included), and another tenant's `GET` of its own
job went from 29 ms to 1.28 s.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, insert, update

from persistence.lifecycle import (
    MAX_ERROR_TEXT_BYTES,
    MAX_EVENT_MESSAGE_BYTES,
    MAX_EVENTS_PER_JOB,
    bound_error,
)
from persistence.models import Job, StageEventRow, utcnow
from schemas import ErrorBody, JobPublic, JobSummary
from service.deps import AppState

JOBS = 100
SUMMARY_BYTES = 1024
"""What one summary may take at most (its strings are ids, statuses and file names)."""


def _fill_to_the_bound(state: AppState, job_ids: list[str]) -> None:
    """Every job failed, with the most events and the largest error a record keeps."""
    error = bound_error(
        ErrorBody(
            code="model_import_failed",
            message="m" * 2 * MAX_ERROR_TEXT_BYTES,
            hint="h" * 2 * MAX_ERROR_TEXT_BYTES,
            details={f"k{i}": "d" * 2048 for i in range(200)},
        )
    ).model_dump_json()
    now = utcnow()
    message = "p" * MAX_EVENT_MESSAGE_BYTES
    with state.engine.begin() as conn:
        conn.execute(
            insert(StageEventRow),
            [
                {
                    "job_id": job_id,
                    "seq": seq,
                    "stage": "tracing",
                    "status": "progress",
                    "message": message,
                    "at": now,
                }
                for job_id in job_ids
                for seq in range(1, MAX_EVENTS_PER_JOB + 1)
            ],
        )
        conn.execute(
            update(Job)
            .where(Job.id.in_(job_ids))
            .values(status="failed", error_json=error, finished_at=now)
        )


def test_the_list_is_summaries_bounded_in_bytes(client: TestClient, state: AppState) -> None:
    job_ids = [
        client.post("/v1/exports", files={"model": ("m.py", f"model = {i}\n".encode())}).json()[
            "id"
        ]
        for i in range(JOBS)
    ]
    _fill_to_the_bound(state, job_ids)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(state.engine, "before_cursor_execute", seen)
    try:
        page = client.get("/v1/exports", params={"limit": JOBS})
    finally:
        event.remove(state.engine, "before_cursor_execute", seen)
    assert page.status_code == 200
    assert len(page.content) <= JOBS * SUMMARY_BYTES  # was 40 MiB
    items = page.json()["items"]
    assert [item["id"] for item in items] == job_ids[::-1]
    for item in items:
        summary = JobSummary.model_validate(item)  # strict: no field it does not declare
        assert summary.status == "failed"
        assert summary.error is not None and summary.error.code == "model_import_failed"
        assert summary.model_name == "m.py"
    # Neither events nor artifacts were read for the page.
    assert not [s for s in statements if "stage_events" in s or "artifacts" in s]
    # The whole job is at its own URL.
    whole = JobPublic.model_validate(client.get(f"/v1/exports/{job_ids[0]}").json())
    assert len(whole.stages) == MAX_EVENTS_PER_JOB + 1
    assert whole.error is not None and whole.error.details


def test_summaries_of_queued_and_succeeded_jobs(client: TestClient, state: AppState) -> None:
    job_id = client.post("/v1/exports", files={"model": ("net.py", b"model = 1\n")}).json()["id"]
    (item,) = client.get("/v1/exports").json()["items"]
    summary = JobSummary.model_validate(item)
    assert (summary.id, summary.status, summary.error, summary.cache_hit) == (
        job_id,
        "queued",
        None,
        False,
    )
    assert (summary.model_name, summary.inputs_name, summary.attempts) == ("net.py", None, 0)


def test_summaries_read_the_error_code_on_every_setup(any_setup: TestClient) -> None:
    job_id = any_setup.post("/v1/exports", files={"model": ("m.py", b"model = 1\n")}).json()["id"]
    assert any_setup.delete(f"/v1/exports/{job_id}").status_code == 200
    (item,) = any_setup.get("/v1/exports", params={"status": "canceled"}).json()["items"]
    summary = JobSummary.model_validate(item)
    assert summary.error is not None and summary.error.code == "canceled"


def test_summaries_carry_the_targets_asked_for_on_every_setup(any_setup: TestClient) -> None:
    options = {"targets": ["onnx", "executorch"]}
    asked = any_setup.post(
        "/v1/exports",
        files={"model": ("t.py", b"model = 1\n")},
        data={"options": json.dumps(options)},
    ).json()["id"]
    plain = any_setup.post("/v1/exports", files={"model": ("p.py", b"model = 2\n")}).json()["id"]
    items = {
        item["id"]: JobSummary.model_validate(item)
        for item in any_setup.get("/v1/exports").json()["items"]
    }
    assert items[asked].targets == ["onnx", "executorch"]
    assert items[plain].targets == []
