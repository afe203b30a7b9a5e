"""Retention, the collector and the per-key storage quota, through the API, against real
PostgreSQL and a local store (no worker: jobs are finished as a worker finishes them,
`store_artifacts` leasing what it puts)."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Interval, delete, literal, select, update

from persistence import retention
from persistence.database import transaction
from persistence.lifecycle import claim, finish
from persistence.models import Blob, Job
from schemas import ErrorBody
from service import auth
from service.app import build_state, collect_once, create_app
from service.deps import AppState
from tests.service.conftest import LOOPBACK_CLIENT, make_settings, model_file
from worker.execution import store_artifacts

RETENTION = timedelta(hours=24)
WEIGHTS = 40 * 1024
"""Each hostile submission's weights: 40 KiB standing for the report's 40 MB."""


@pytest.fixture(autouse=True)
def _no_key_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CACHE_TTL_S", 0.0)


def blobs_on_disk(state: AppState) -> set[str]:
    root = Path(state.store.url)
    return {p.name for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")}


def submit(
    client: TestClient, weights: bytes, headers: dict[str, str] | None = None, **data: str
) -> dict:
    files = {"model": model_file(), "weights": ("w.safetensors", weights)}
    return client.post("/v1/exports", files=files, data=data, headers=headers or {})


def finish_job(state: AppState, job_id: str, tmp_path: Path, *, ok: bool) -> None:
    """Finish a queued job as a worker does: artifacts leased and stored, row finished."""
    assert claim(state.sessions, job_id, "w") is not None
    out = tmp_path / job_id
    out.mkdir()
    files = {"report.json": out / "report.json"}
    files["report.json"].write_bytes(b'{"job": "%s"}' % job_id.encode())
    if ok:
        files["program.pt2"] = out / "program.pt2"
        files["program.pt2"].write_bytes(b"PK" + job_id.encode() * 100)
    stored = store_artifacts(
        state.store, files, 2**30, lease=functools.partial(retention.lease, state.sessions)
    )
    error = None if ok else ErrorBody(code="model_import_failed", message="boom")
    status = "succeeded" if ok else "failed"
    assert finish(state.sessions, job_id, "w", status=status, error=error, artifacts=stored)


def age(state: AppState, hours: float, job_ids: list[str] | None = None) -> None:
    """Move jobs' finish (all, or `job_ids`) and every lease `hours` into the past."""
    back = literal(timedelta(hours=hours), Interval())
    with transaction(state.sessions) as session:
        jobs = update(Job).values(finished_at=Job.finished_at - back)
        if job_ids is not None:
            jobs = jobs.where(Job.id.in_(job_ids))
        session.execute(jobs)
        session.execute(update(Blob).values(leased_at=Blob.leased_at - back))


def failed_long_ago(client: TestClient, state: AppState, tmp_path: Path, weights: bytes) -> str:
    """A job of these weights that failed 25 hours ago (its leases as old); its id."""
    job_id = submit(client, weights).json()["id"]
    finish_job(state, job_id, tmp_path, ok=False)
    age(state, 25)
    return str(job_id)


def collect(state: AppState, **kwargs: object) -> retention.Collection:
    return retention.collect(state.sessions, state.store, retention=RETENTION, **kwargs)  # type: ignore[arg-type]


def test_five_failed_jobs_with_distinct_weights_leave_nothing_once_expired(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    ids = []
    for _ in range(5):
        answer = submit(client, os.urandom(WEIGHTS))
        assert answer.status_code == 202
        ids.append(answer.json()["id"])
        finish_job(state, ids[-1], tmp_path, ok=False)
    # 5 weights, 1 model (the same file each time), 5 reports.
    assert len(blobs_on_disk(state)) == 11
    assert collect(state).expired_jobs == []  # within the retention time: all kept
    assert len(blobs_on_disk(state)) == 11

    age(state, 25)
    dry = collect(state, dry_run=True)
    assert dry.dry_run and sorted(dry.expired_jobs) == sorted(ids)
    assert len(dry.deleted) == 11 and dry.deleted_bytes >= 5 * WEIGHTS
    assert len(blobs_on_disk(state)) == 11  # a dry run changes nothing

    done = collect(state)
    assert sorted(done.expired_jobs) == sorted(ids)
    assert done.deleted == dry.deleted
    assert blobs_on_disk(state) == set()
    with state.sessions() as session:
        assert session.scalars(select(Blob.sha256)).all() == []
    for job_id in ids:
        job = client.get(f"/v1/exports/{job_id}").json()
        assert job["status"] == "failed" and job["error"]["code"] == "model_import_failed"
        assert job["expired_at"] is not None
        for path in ("artifacts/report.json", "uploads/weights", "uploads/model"):
            gone = client.get(f"/v1/exports/{job_id}/{path}")
            assert gone.status_code == 410, path
            assert gone.json()["code"] == "expired"
            assert gone.json()["details"]["job_id"] == job_id
        # A name the job never had stays not_found.
        assert client.get(f"/v1/exports/{job_id}/artifacts/model.onnx").status_code == 404
    assert collect(state) == retention.Collection(dry_run=False)  # nothing left to do


def test_a_blob_stays_while_an_unexpired_job_refers_to_it(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    weights = os.urandom(WEIGHTS)
    old = failed_long_ago(client, state, tmp_path, weights)
    # Same weights, other options: another job holding the same blob, still queued.
    new = submit(client, weights, options='{"strict": true}').json()["id"]
    before = blobs_on_disk(state)

    done = collect(state)

    assert done.expired_jobs == [old]
    old_report = client.get(f"/v1/exports/{old}").json()["artifacts"][0]["sha256"]
    assert blobs_on_disk(state) == before - {old_report}
    assert client.get(f"/v1/exports/{old}/uploads/weights").status_code == 410
    kept = client.get(f"/v1/exports/{new}/uploads/weights")
    assert kept.status_code == 200 and kept.content == weights


def test_a_lease_taken_before_the_collector_deletes_keeps_the_blob(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    # A submission of the same weights leases them before it puts them (the store then
    # skips the bytes it holds) and before its job is committed: the collector must not
    # delete the blob in between.
    weights = os.urandom(WEIGHTS)
    old = failed_long_ago(client, state, tmp_path, weights)
    sha = next(s for s in blobs_on_disk(state) if state.store.size(s) == WEIGHTS)
    retention.lease(state.sessions, {sha: WEIGHTS})

    done = collect(state)

    assert done.expired_jobs == [old] and sha not in done.deleted
    assert state.store.exists(sha)
    age(state, 2)  # the lease lapsed and no job came to refer to the blob
    assert sha in collect(state).deleted
    assert not state.store.exists(sha)


def test_a_lease_waits_for_a_deletion_in_progress_and_then_finds_the_blob_gone(
    state: AppState, tmp_path: Path
) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 100)
    sha, size = state.store.put_file(path)
    retention.lease(state.sessions, {sha: size})
    leased = threading.Event()
    with transaction(state.sessions) as session:  # what a collector holds while it deletes
        session.execute(delete(Blob).where(Blob.sha256 == sha))
        state.store.delete(sha)
        writer = threading.Thread(
            target=lambda: (retention.lease(state.sessions, {sha: size}), leased.set())
        )
        writer.start()
        assert not leased.wait(0.5)  # the lease waits for the collector's transaction
    writer.join(10)
    assert leased.is_set()
    # After the lease, a writer puts the bytes again (the blob is gone) and relies on them.
    assert not state.store.exists(sha)
    assert state.store.put_file(path) == (sha, size) and state.store.exists(sha)
    with state.sessions() as session:
        assert session.get(Blob, sha) is not None


def test_a_cache_hit_holds_the_files_anew_and_an_expired_result_is_no_hit(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    weights = os.urandom(WEIGHTS)
    first = submit(client, weights).json()["id"]
    finish_job(state, first, tmp_path, ok=True)
    age(state, 20)
    hit = submit(client, weights).json()
    assert hit["cache_hit"] is True and hit["status"] == "succeeded"
    age(state, 5, [first])  # the first job is past its retention, the hit is not

    assert collect(state).expired_jobs == [first]

    program = client.get(f"/v1/exports/{hit['id']}/artifacts/program.pt2")
    assert program.status_code == 200 and program.content.startswith(b"PK")
    assert client.get(f"/v1/exports/{first}/artifacts/program.pt2").status_code == 410
    age(state, 25)
    assert collect(state).expired_jobs == [hit["id"]]
    assert blobs_on_disk(state) == set()
    again = submit(client, weights).json()
    assert again["cache_hit"] is False and again["status"] == "queued"


@pytest.fixture
def quota_state(tmp_path: Path, pg_url: str, redis_prefix: str) -> Iterator[AppState]:
    settings = make_settings(tmp_path, pg_url, redis_prefix, storage_quota_bytes=100 * 1024)
    state = build_state(settings)
    with state.engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE stage_events, artifacts, jobs, api_keys, blobs CASCADE")
    yield state
    state.engine.dispose()


def test_a_key_over_its_storage_quota_is_refused_until_its_jobs_expire(
    quota_state: AppState, tmp_path: Path
) -> None:
    state = quota_state
    with transaction(state.sessions) as session:
        key = auth.create_key(session, "tenant")
    headers = {"Authorization": f"Bearer {key.secret}"}
    model_size = len(model_file()[1])
    with TestClient(create_app(state=state), client=LOOPBACK_CLIENT) as client:
        first_weights = os.urandom(60 * 1024)
        first = submit(client, first_weights, headers)
        assert first.status_code == 202
        finish_job(state, first.json()["id"], tmp_path, ok=False)
        with state.sessions() as session:
            used = retention.stored_bytes(session, key.id)
        assert used > model_size + 60 * 1024  # the uploads and the report
        stored = blobs_on_disk(state)

        refused = submit(client, os.urandom(60 * 1024), headers)

        assert refused.status_code == 413
        body = refused.json()
        assert body["code"] == "storage_quota_exceeded"
        assert body["details"] == {
            "used_bytes": used,
            "request_bytes": 60 * 1024,  # the model is held already: not counted again
            "limit_bytes": 100 * 1024,
        }
        assert blobs_on_disk(state) == stored  # nothing of a refused submission is kept
        # The same weights again (other options): nothing new to hold, so accepted.
        same = submit(client, first_weights, headers, options='{"strict": true}')
        assert same.status_code == 202
        finish_job(state, same.json()["id"], tmp_path, ok=False)
        with state.sessions() as session:
            grown = retention.stored_bytes(session, key.id)
        assert 0 < grown - used < 1024  # only the second report

        age(state, 24 * 7 + 1)
        assert len(collect_once(state).expired_jobs) == 2  # the default retention: a week
        with state.sessions() as session:
            assert retention.stored_bytes(session, key.id) == 0
        assert submit(client, os.urandom(60 * 1024), headers).status_code == 202
        listed = client.get("/v1/exports", headers=headers).json()["items"]
        assert sum(1 for job in listed if job["expired_at"] is not None) == 2


def test_keyless_servers_and_a_quota_of_0_do_not_count(quota_state: AppState) -> None:
    with TestClient(create_app(state=quota_state), client=LOOPBACK_CLIENT) as client:
        for _ in range(3):  # keyless (loopback only): not limited, as the rate limits
            assert submit(client, os.urandom(60 * 1024)).status_code == 202
        with transaction(quota_state.sessions) as session:
            key = auth.create_key(session, "unlimited")
        quota_state.settings.storage_quota_bytes = 0
        for _ in range(3):
            answer = submit(
                client, os.urandom(60 * 1024), {"Authorization": f"Bearer {key.secret}"}
            )
            assert answer.status_code == 202
