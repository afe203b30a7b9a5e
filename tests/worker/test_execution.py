"""A worker running jobs: claim, progress, cancel, artifacts, recovery of lost jobs.

The sandbox is replaced by a scripted runner here (its own tests are in tests/sandbox);
the database is the real PostgreSQL. Real sandboxed runs are in tests/integration.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from persistence.database import transaction
from persistence.lifecycle import claim, recover_lost_jobs
from persistence.models import Blob, Job, StageEventRow, utcnow
from persistence.records import load_job, to_public
from schemas import ErrorBody, ExportOptions, Progress
from worker.execution import WorkerContext, execute


@dataclass
class ScriptedResult:
    report: Any
    artifacts: dict[str, Path]
    error: ErrorBody | None
    stdout_tail: str = ""


class ScriptedRunner:
    """Reports two stages and writes the given artifacts, or waits for cancel."""

    def __init__(
        self,
        *,
        error: ErrorBody | None = None,
        wait_for_cancel: bool = False,
        extra: dict[str, bytes] | None = None,
        raises: bool = False,
    ) -> None:
        self.error = error
        self.wait_for_cancel = wait_for_cancel
        self.extra = extra or {}
        self.raises = raises
        self.jobs: list[Any] = []

    def run(self, job: Any, *, on_progress: Any = None, cancel: threading.Event | None = None):
        self.jobs.append(job)
        if self.raises:
            raise RuntimeError("zygote exploded")
        assert on_progress is not None and cancel is not None
        on_progress(Progress(stage="loading", fraction=0.0))
        on_progress(Progress(stage="tracing", fraction=0.5))
        if self.wait_for_cancel:
            assert cancel.wait(10), "cancel never arrived"
            return ScriptedResult(None, {}, ErrorBody(code="canceled", message="killed"))
        staged = job.job_dir / "in"  # as the sandbox stages a job: each upload copied in
        staged.mkdir()
        for source in job.uploads().values():
            source.copy_to(staged / source.name)
        out = job.job_dir / "out"
        out.mkdir(exist_ok=True)
        files = {"program.pt2": b"PK\x03\x04data", "report.json": b"{}", **self.extra}
        artifacts = {}
        for name, data in files.items():
            (out / name.replace("/", "_")).write_bytes(data)
            artifacts[name] = out / name.replace("/", "_")
        return ScriptedResult(None, artifacts, self.error)

    def close(self) -> None:
        pass


def add_job(
    ctx: WorkerContext,
    tmp_path: Path,
    options: ExportOptions | None = None,
    callback_url: str | None = None,
) -> str:
    source = tmp_path / "model.py"
    source.write_text("model = 1\n")
    sha, _ = ctx.store.put_file(source)
    job_id = f"job-{time.monotonic_ns()}"
    with transaction(ctx.sessions) as session:
        session.add(
            Job(
                id=job_id,
                status="queued",
                options_json=(options or ExportOptions()).model_dump_json(),
                callback_url=callback_url,
                cache_key="k" * 64,
                cache_hit=False,
                queue="cpu",
                model_sha256=sha,
                model_name="model.py",
                attempts=0,
                cancel_requested=False,
                webhook_attempts=0,
                created_at=utcnow(),
                enqueued_at=utcnow(),
            )
        )
        session.add(StageEventRow(job_id=job_id, seq=0, status="queued", at=utcnow()))
    return job_id


def public(ctx: WorkerContext, job_id: str):
    with ctx.sessions() as session:
        job = load_job(session, job_id)
        assert job is not None
        return to_public(job)


def test_a_job_runs_once_and_records_stages_and_artifacts(
    context: WorkerContext, tmp_path: Path
) -> None:
    runner = ScriptedRunner()
    context._runner = runner
    job_id = add_job(context, tmp_path)
    assert execute(context, job_id) == "succeeded"
    assert execute(context, job_id) is None  # idempotent: a finished job is not redone
    assert len(runner.jobs) == 1
    assert runner.jobs[0].model.name == "model.py"
    job = public(context, job_id)
    assert job.status == "succeeded"
    assert job.attempts == 1
    assert [(e.status, e.stage) for e in job.stages] == [
        ("queued", None),
        ("running", None),
        ("started", "loading"),
        ("started", "tracing"),
        ("succeeded", None),
    ]
    assert sorted(a.name for a in job.artifacts) == ["program.pt2", "report.json"]
    assert not (context.settings.resolved_work_dir / job_id).exists()
    # Leased before they were stored (the collector keeps them; they count to the quota).
    with context.sessions() as session:
        leased = {b.sha256: b.size for b in session.scalars(select(Blob))}
    assert {a.sha256: a.size for a in job.artifacts}.items() <= leased.items()


def test_export_errors_fail_the_job_with_their_code(context: WorkerContext, tmp_path: Path) -> None:
    context._runner = ScriptedRunner(error=ErrorBody(code="data_dependent", message="x"))
    job_id = add_job(context, tmp_path)
    assert execute(context, job_id) == "failed"
    job = public(context, job_id)
    assert job.error is not None and job.error.code == "data_dependent"
    assert "report.json" in [a.name for a in job.artifacts]


def test_a_runner_crash_is_an_internal_error_not_a_retry(
    context: WorkerContext, tmp_path: Path
) -> None:
    context._runner = ScriptedRunner(raises=True)
    job_id = add_job(context, tmp_path)
    assert execute(context, job_id) == "failed"
    error = public(context, job_id).error
    assert error is not None and error.code == "internal_error"
    assert error.details["type"] == "RuntimeError"


def test_untrusted_artifact_names_are_dropped(context: WorkerContext, tmp_path: Path) -> None:
    context._runner = ScriptedRunner(extra={"../escape.json": b"{}", ".hidden": b"x"})
    job_id = add_job(context, tmp_path)
    execute(context, job_id)
    assert sorted(a.name for a in public(context, job_id).artifacts) == [
        "program.pt2",
        "report.json",
    ]


def test_cancel_reaches_the_running_sandbox(context: WorkerContext, tmp_path: Path) -> None:
    context._runner = ScriptedRunner(wait_for_cancel=True)
    job_id = add_job(context, tmp_path)
    outcome: list[str | None] = []
    thread = threading.Thread(target=lambda: outcome.append(execute(context, job_id)))
    thread.start()
    deadline = time.monotonic() + 5
    while public(context, job_id).status != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    with transaction(context.sessions) as session:
        session.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
    thread.join(10)
    assert outcome == ["canceled"]
    job = public(context, job_id)
    assert job.status == "canceled"
    assert job.error is not None and job.error.code == "canceled"


def test_a_lost_job_is_requeued_once_then_failed(context: WorkerContext, tmp_path: Path) -> None:
    job_id = add_job(context, tmp_path)

    def lose() -> None:
        assert claim(context.sessions, job_id, "dead-worker") is not None
        stale = utcnow() - timedelta(seconds=60)
        with transaction(context.sessions) as session:
            session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=stale))

    lose()
    first = recover_lost_jobs(context.sessions, heartbeat_timeout_s=1, requeue_after_s=3600)
    assert first.requeued == [(job_id, "cpu")]
    assert public(context, job_id).status == "queued"
    lose()
    second = recover_lost_jobs(context.sessions, heartbeat_timeout_s=1, requeue_after_s=3600)
    assert second.failed == [job_id]
    job = public(context, job_id)
    assert job.status == "failed"
    assert job.error is not None
    assert (job.error.code, job.error.details["reason"]) == ("internal_error", "worker_lost")
    assert job.attempts == 2


def test_a_live_worker_keeps_its_job(context: WorkerContext, tmp_path: Path) -> None:
    job_id = add_job(context, tmp_path)
    assert claim(context.sessions, job_id, "alive") is not None
    recovery = recover_lost_jobs(context.sessions, heartbeat_timeout_s=30, requeue_after_s=3600)
    assert recovery.requeued == [] and recovery.failed == []
    assert public(context, job_id).status == "running"


def test_queued_jobs_the_broker_lost_are_sent_again(context: WorkerContext, tmp_path: Path) -> None:
    job_id = add_job(context, tmp_path)
    with transaction(context.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(enqueued_at=utcnow() - timedelta(seconds=100))
        )
    recovery = recover_lost_jobs(context.sessions, heartbeat_timeout_s=30, requeue_after_s=10)
    assert recovery.requeued == [(job_id, "cpu")]
    again = recover_lost_jobs(context.sessions, heartbeat_timeout_s=30, requeue_after_s=10)
    assert again.requeued == []


def test_options_reach_the_sandbox_without_the_callback(
    context: WorkerContext, tmp_path: Path
) -> None:
    runner = ScriptedRunner()
    context._runner = runner
    job_id = add_job(
        context, tmp_path, ExportOptions(strict=True), callback_url="http://127.0.0.1:1/hook"
    )
    execute(context, job_id)
    sent = runner.jobs[0].options
    assert isinstance(sent, ExportOptions)  # typed, as the API validated them
    assert sent.strict is True
    assert "callback_url" not in sent.model_dump()
    assert public(context, job_id).callback_url == "http://127.0.0.1:1/hook"


def test_uploads_are_fetched_straight_into_the_job_as_copies(
    context: WorkerContext, tmp_path: Path
) -> None:
    runner = ScriptedRunner()
    context._runner = runner
    seen: dict[str, tuple[int, int, bytes]] = {}
    original = runner.run

    def run(job: Any, **kwargs: Any) -> Any:
        result = original(job, **kwargs)
        staged = job.job_dir / "in" / "model.py"
        seen["model"] = (staged.stat().st_ino, staged.stat().st_nlink, staged.read_bytes())
        return result

    runner.run = run  # type: ignore[method-assign]
    job_id = add_job(context, tmp_path)
    assert execute(context, job_id) == "succeeded"
    with context.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        blob = context.store.local_path(job.model_sha256)  # type: ignore[attr-defined]
    inode, links, data = seen["model"]
    assert data == blob.read_bytes() == b"model = 1\n"
    # A copy of its own: the job's uid will own it; a link would hand it the shared blob.
    assert inode != blob.stat().st_ino
    assert links == 1
    assert not (context.settings.resolved_work_dir / job_id).exists()  # nothing else kept
