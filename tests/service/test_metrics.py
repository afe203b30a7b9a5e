"""`/metrics` after jobs ended in every way a job ends, against real PostgreSQL: jobs are
finished by the lifecycle functions a worker, the reaper and the API call, worker
processes record themselves as a worker's presence thread does. Values, not wording."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Interval, literal, select, update

from persistence import worker_processes
from persistence.database import transaction
from persistence.lifecycle import claim, fail_job, finish, recover_lost_jobs
from persistence.models import Job, WorkerProcess, utcnow
from schemas import Environment, ErrorBody, ReportDocument, StageRecord, TargetResult
from service.app import reap_once
from service.deps import AppState
from tests.service.test_exports import complete, submit

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: TestClient) -> Samples:
    """Every sample of `/metrics` by name and labels, the snapshot refreshed first (the
    app refreshes it every `TORCHPORT_METRICS_REFRESH_INTERVAL_S`)."""
    client.app.state.torchport.metrics.refresh()  # type: ignore[attr-defined]
    text = client.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def backdate(state: AppState, job_id: str, seconds: float) -> None:
    with transaction(state.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(created_at=Job.created_at - literal(timedelta(seconds=seconds), Interval()))
        )


def report(*stages: tuple[str, float], targets: dict[str, str] | None = None) -> ReportDocument:
    return ReportDocument(
        status="succeeded",
        stages=[StageRecord(name=n, status="succeeded", duration_s=d) for n, d in stages],  # type: ignore[arg-type]
        targets={t: TargetResult(status=r) for t, r in (targets or {}).items()},  # type: ignore[arg-type]
        environment=Environment(torchport="0", python="3", platform="linux"),
    )


def test_job_durations_by_outcome_and_code(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    succeeded = submit(client, model=("a.py", b"model = None\n")).json()["id"]
    backdate(state, succeeded, 20)  # submitted 20 s ago: the 30 s bucket
    complete(state, succeeded, tmp_path)
    failed = submit(client, model=("b.py", b"model = 1\n")).json()["id"]
    complete(state, failed, tmp_path, ok=False)  # model_not_found, within a second
    canceled = submit(client, model=("c.py", b"model = 2\n")).json()["id"]
    assert client.delete(f"/v1/exports/{canceled}").status_code == 200
    infra = submit(client, model=("d.py", b"model = 3\n")).json()["id"]
    assert fail_job(state.sessions, infra, ErrorBody(code="internal_error", message="x"))
    lost = submit(client, model=("e.py", b"model = 4\n")).json()["id"]
    with transaction(state.sessions) as session:  # lost twice already: the reaper fails it
        session.execute(update(Job).where(Job.id == lost).values(attempts=1))
    assert claim(state.sessions, lost, "gone") is not None
    assert recover_lost_jobs(state.sessions, heartbeat_timeout_s=0, requeue_after_s=60).failed == [
        lost
    ]

    samples = scrape(client)
    name = "torchport_job_duration_seconds"
    ok = {"outcome": "succeeded", "code": ""}
    assert value(samples, f"{name}_count", **ok) == 1
    assert 20 <= value(samples, f"{name}_sum", **ok) < 30
    assert value(samples, f"{name}_bucket", **ok, le="10.0") == 0
    assert value(samples, f"{name}_bucket", **ok, le="30.0") == 1
    assert value(samples, f"{name}_bucket", **ok, le="+Inf") == 1
    assert value(samples, f"{name}_count", outcome="failed", code="model_not_found") == 1
    assert value(samples, f"{name}_bucket", outcome="failed", code="model_not_found", le="1.0") == 1
    assert value(samples, f"{name}_count", outcome="canceled", code="canceled") == 1
    assert value(samples, f"{name}_count", outcome="failed", code="internal_error") == 2
    assert value(samples, "torchport_jobs", status="failed") == 3


def test_stage_durations_and_targets_come_from_the_report(
    client: TestClient, state: AppState
) -> None:
    job_id = submit(client).json()["id"]
    assert claim(state.sessions, job_id, "w") is not None
    stages = [("loading", 0.3), ("tracing", 2.0), ("verifying", 0.04), ("converting", 40.0)]
    done = report(*stages, targets={"onnx": "succeeded", "executorch": "failed"})
    assert finish(
        state.sessions, job_id, "w", status="succeeded", error=None, artifacts=[], report=done
    )
    samples = scrape(client)
    name = "torchport_stage_duration_seconds"
    for stage, seconds in stages:
        assert value(samples, f"{name}_count", stage=stage) == 1
        assert value(samples, f"{name}_sum", stage=stage) == seconds
    assert value(samples, f"{name}_bucket", stage="tracing", le="1.0") == 0
    assert value(samples, f"{name}_bucket", stage="tracing", le="2.5") == 1
    assert value(samples, f"{name}_bucket", stage="verifying", le="0.05") == 1
    assert value(samples, f"{name}_count", stage="decomposing") == 0
    conversions = "torchport_target_conversions_total"
    assert value(samples, conversions, target="onnx", result="succeeded") == 1
    assert value(samples, conversions, target="executorch", result="failed") == 1
    assert value(samples, conversions, target="aoti", result="succeeded") == 0


def test_cache_hits_are_counted_once_in_the_database(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    job_id = submit(client).json()["id"]
    complete(state, job_id, tmp_path)
    assert value(scrape(client), "torchport_cache_hits_total") == 0
    for _ in range(2):
        assert submit(client).json()["cache_hit"] is True
    samples = scrape(client)
    assert value(samples, "torchport_cache_hits_total") == 2
    # Cache hits end at once: they are not in the job durations.
    assert value(samples, "torchport_job_duration_seconds_count", outcome="succeeded", code="") == 1


def test_queue_depth_and_the_oldest_queued_job(client: TestClient, state: AppState) -> None:
    assert value(scrape(client), "torchport_queue_depth", queue="cpu") == 0
    old = submit(client, model=("a.py", b"model = None\n")).json()["id"]
    backdate(state, old, 120)
    submit(client, model=("b.py", b"model = 1\n"))
    gpu = submit(client, model=("c.py", b"model = 2\n"), options='{"device": "cuda"}').json()
    running = submit(client, model=("d.py", b"model = 3\n")).json()["id"]
    assert claim(state.sessions, running, "w") is not None

    samples = scrape(client)
    assert value(samples, "torchport_queue_depth", queue="cpu") == 2
    assert value(samples, "torchport_queue_depth", queue="gpu") == 1
    assert 120 <= value(samples, "torchport_queue_oldest_age_seconds", queue="cpu") < 180
    assert value(samples, "torchport_queue_oldest_age_seconds", queue="gpu") < 60
    assert client.delete(f"/v1/exports/{gpu['id']}").status_code == 200
    samples = scrape(client)
    assert value(samples, "torchport_queue_depth", queue="gpu") == 0
    assert value(samples, "torchport_queue_oldest_age_seconds", queue="gpu") == 0


def test_workers_busy_and_idle_from_their_heartbeats(client: TestClient, state: AppState) -> None:
    worker_processes.beat(state.sessions, "host-a:1", "host-a", ["cpu"])
    worker_processes.beat(state.sessions, "host-a:2", "host-a", ["cpu"])
    worker_processes.beat(state.sessions, "host-b:1", "host-b", ["gpu"])
    worker_processes.beat(state.sessions, "host-c:1", "host-c", ["cpu"])
    with transaction(state.sessions) as session:  # killed an hour ago: neither busy nor idle
        session.execute(
            update(WorkerProcess)
            .where(WorkerProcess.id == "host-c:1")
            .values(seen_at=utcnow() - timedelta(hours=2))
        )
    job_id = submit(client).json()["id"]
    assert claim(state.sessions, job_id, "host-a:2") is not None

    samples = scrape(client)
    assert value(samples, "torchport_workers", queue="cpu", state="busy") == 1
    assert value(samples, "torchport_workers", queue="cpu", state="idle") == 1
    assert value(samples, "torchport_workers", queue="gpu", state="idle") == 1
    assert value(samples, "torchport_workers", queue="gpu", state="busy") == 0

    worker_processes.forget(state.sessions, "host-b:1")
    reap_once(state)  # prunes the row of the process killed long ago
    with state.sessions() as session:
        assert sorted(session.scalars(select(WorkerProcess.id))) == ["host-a:1", "host-a:2"]
    assert value(scrape(client), "torchport_workers", queue="gpu", state="idle") == 0
