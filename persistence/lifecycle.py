"""State changes of a job after submission: claimed by a worker, stage events, heartbeats,
finished; and recovery of jobs whose worker died or whose queue message was lost.

This is the one place job records are written after submission, so it is where they are
bounded: at most `MAX_EVENTS_PER_JOB` progress events per job, messages and errors cut
with a visible `… [truncated N bytes]` marker (a job's own code chooses them).

Every change is a conditional UPDATE on the job row, so two workers (a redelivered
message, a re-queued job) can never both run one job, and a finished job is never redone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from persistence import job_metrics
from persistence.database import transaction
from persistence.models import Artifact, Job, StageEventRow, utcnow
from persistence.records import job_spec, next_seq
from schemas import ErrorBody, JobSpec, ReportDocument

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 2
"""A job whose worker died is re-queued once; the second loss fails it."""

MAX_EVENTS_PER_JOB = 200
"""Stage events a worker may record for one job (a progress event every 0.5 s at most
within a stage; the job's own code can write progress lines). Later progress updates the
job's stage but is not kept; the lifecycle's own events (running, queued again, the final
status) are always recorded, so a job never has more than a few more than this."""
MAX_EVENT_MESSAGE_BYTES = 2048
"""Longest stage event message kept (UTF-8 bytes), the rest replaced by a marker."""
MAX_ERROR_TEXT_BYTES = 16 * 1024
"""Longest error `message`, `hint` or `location.code` kept."""
MAX_ERROR_DETAILS_BYTES = 64 * 1024
"""Largest error `details` kept as they are (as JSON); larger ones have their strings and
lists shortened."""
EVENT_LIMIT_MESSAGE = (
    f"[event limit of {MAX_EVENTS_PER_JOB} reached: later progress of this job is not recorded]"
)


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, with a visible marker of what was cut."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    kept = encoded[:limit].decode("utf-8", "ignore")
    return f"{kept}… [truncated {len(encoded) - len(kept.encode('utf-8'))} bytes]"


def _shorten(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return truncate(value, 1024)
    if depth > 8:
        return "… [truncated: nested too deep]"
    if isinstance(value, dict):
        items = list(value.items())
        kept = {str(k)[:200]: _shorten(v, depth + 1) for k, v in items[:100]}
        if len(items) > 100:
            kept["…"] = f"[truncated {len(items) - 100} more keys]"
        return kept
    if isinstance(value, list | tuple):
        shortened = [_shorten(v, depth + 1) for v in value[:50]]
        if len(value) > 50:
            shortened.append(f"… [truncated {len(value) - 50} more items]")
        return shortened
    return value


def bound_error(error: ErrorBody) -> ErrorBody:
    """The error as a job record keeps it: message, hint, location and details bounded
    (a job's own exception can carry megabytes; the record is served on every GET)."""
    update: dict[str, Any] = {"message": truncate(error.message, MAX_ERROR_TEXT_BYTES)}
    if error.hint is not None:
        update["hint"] = truncate(error.hint, MAX_ERROR_TEXT_BYTES)
    if error.location is not None:
        update["location"] = error.location.model_copy(
            update={
                "file": truncate(error.location.file, 1024),
                "code": None
                if error.location.code is None
                else truncate(error.location.code, MAX_ERROR_TEXT_BYTES),
            }
        )
    size = len(json.dumps(error.details, default=str))
    if size > MAX_ERROR_DETAILS_BYTES:
        details = _shorten(error.details)
        if len(json.dumps(details, default=str)) > MAX_ERROR_DETAILS_BYTES:
            details = {"truncated": f"[details of {size} bytes not kept]"}
        update["details"] = details
    if len(error.exportdb) > 50:
        update["exportdb"] = error.exportdb[:50]
    return error.model_copy(update=update)


@dataclass(frozen=True)
class ClaimedJob:
    """What a worker needs to run a job it claimed."""

    id: str
    attempt: int
    spec: JobSpec
    """The job's description, typed (`persistence.records.job_spec`)."""
    owner: str | None = None
    """The id of the API key that submitted it (None on a server without keys)."""


def mark_unsent(sessions: sessionmaker[Session], job_id: str) -> None:
    """Note that sending a queued job to the broker failed, so the reaper sends it soon."""
    with transaction(sessions) as session:
        session.execute(
            update(Job).where(Job.id == job_id, Job.status == "queued").values(enqueued_at=None)
        )


def add_event(
    session: Session,
    job_id: str,
    status: str,
    *,
    stage: str | None = None,
    fraction: float | None = None,
    message: str | None = None,
    bounded: bool = False,
) -> bool:
    """Append a stage event to a job, its message cut to `MAX_EVENT_MESSAGE_BYTES`.

    `bounded` (a worker's progress): not recorded once the job has `MAX_EVENTS_PER_JOB`
    events; the last one recorded says so. Returns whether the event was recorded.
    """
    seq = next_seq(session, job_id)
    if bounded and seq >= MAX_EVENTS_PER_JOB - 1:
        if seq > MAX_EVENTS_PER_JOB - 1:
            return False
        message = EVENT_LIMIT_MESSAGE
    session.add(
        StageEventRow(
            job_id=job_id,
            seq=seq,
            stage=stage,
            status=status,
            fraction=fraction,
            message=None if message is None else truncate(message, MAX_EVENT_MESSAGE_BYTES),
            at=utcnow(),
        )
    )
    return True


def claim(sessions: sessionmaker[Session], job_id: str, worker: str) -> ClaimedJob | None:
    """Move a queued job to running for `worker`; `None` if it is not queued any more."""
    with transaction(sessions) as session:
        now = utcnow()
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "queued", Job.cancel_requested.is_(False))
            .values(
                status="running",
                worker=worker,
                heartbeat_at=now,
                started_at=now,
                attempts=Job.attempts + 1,
            )
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return None
        job = session.get(Job, job_id)
        assert job is not None
        add_event(session, job_id, "running", stage=None)
        return ClaimedJob(id=job.id, attempt=job.attempts, spec=job_spec(job), owner=job.owner_id)


def record_stage(
    sessions: sessionmaker[Session],
    job_id: str,
    worker: str,
    *,
    stage: str,
    status: str,
    fraction: float | None = None,
    message: str | None = None,
) -> None:
    """Record a stage change of a running job (ignored once the job left `running`)."""
    with transaction(sessions) as session:
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.worker == worker)
            .values(stage=stage, heartbeat_at=utcnow())
        )
        if result.rowcount == 1:  # type: ignore[attr-defined]
            add_event(
                session,
                job_id,
                status,
                stage=stage,
                fraction=fraction,
                message=message,
                bounded=True,
            )


def heartbeat(sessions: sessionmaker[Session], job_id: str, worker: str) -> bool:
    """Say the job's worker is alive; returns True when the job should stop (canceled,
    or taken away from this worker)."""
    with transaction(sessions) as session:
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.worker == worker)
            .values(heartbeat_at=utcnow())
            .returning(Job.cancel_requested)
        )
        row = result.first()
        return row is None or bool(row[0])


@dataclass(frozen=True)
class StoredArtifact:
    """An artifact already put in the store."""

    name: str
    sha256: str
    size: int
    media_type: str


def finish(
    sessions: sessionmaker[Session],
    job_id: str,
    worker: str,
    *,
    status: str,
    error: ErrorBody | None,
    artifacts: list[StoredArtifact],
    report: ReportDocument | None = None,
) -> bool:
    """Record the end of a running job; False if it was no longer this worker's.

    The error is kept bounded (`bound_error`). The job is counted in the metrics' totals
    (`persistence.job_metrics`), with the stages and targets of its `report`."""
    error = bound_error(error) if error is not None else None
    with transaction(sessions) as session:
        now = utcnow()
        created_at = session.scalar(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.worker == worker)
            .values(
                status=status,
                stage=None,
                finished_at=now,
                error_json=error.model_dump_json() if error else None,
            )
            .returning(Job.created_at)
        )
        if created_at is None:
            return False
        job_metrics.job_ended(
            session,
            status=status,
            code=error.code if error else None,
            created_at=created_at,
            finished_at=now,
            report=report,
        )
        for artifact in artifacts:
            session.merge(
                Artifact(
                    job_id=job_id,
                    name=artifact.name,
                    sha256=artifact.sha256,
                    size=artifact.size,
                    media_type=artifact.media_type,
                    created_at=now,
                )
            )
        add_event(
            session,
            job_id,
            status,
            message=error.code if error else None,
        )
        return True


def fail_job(sessions: sessionmaker[Session], job_id: str, error: ErrorBody) -> bool:
    """Fail a job that is not finished, whoever holds it (used for unrecoverable cases)."""
    error = bound_error(error)
    with transaction(sessions) as session:
        now = utcnow()
        created_at = session.scalar(
            update(Job)
            .where(Job.id == job_id, Job.status.in_(("queued", "running")))
            .values(
                status="failed",
                stage=None,
                finished_at=now,
                error_json=error.model_dump_json(),
            )
            .returning(Job.created_at)
        )
        if created_at is None:
            return False
        job_metrics.job_ended(
            session, status="failed", code=error.code, created_at=created_at, finished_at=now
        )
        add_event(session, job_id, "failed", message=error.code)
        return True


@dataclass
class Recovery:
    """What one pass of `recover_lost_jobs` did."""

    requeued: list[tuple[str, str]]
    """(job id, queue) pairs to send to the broker again, after the commit."""
    failed: list[str]


def recover_lost_jobs(
    sessions: sessionmaker[Session],
    *,
    heartbeat_timeout_s: float,
    requeue_after_s: float,
    all_running_lost: bool = False,
) -> Recovery:
    """Find running jobs whose worker went silent and queued jobs the broker may have lost.

    A lost running job goes back to `queued` once (`attempts` < MAX_ATTEMPTS), then fails
    with `internal_error` and `details.reason = "worker_lost"`. Queued jobs older than
    `requeue_after_s` since their last send are sent again (the claim makes duplicates
    harmless). `all_running_lost` treats every running job as lost (`torchport serve`
    starting: its previous workers are gone for sure).
    """
    now = utcnow()
    requeued: list[tuple[str, str]] = []
    failed: list[str] = []
    with transaction(sessions) as session:
        query = select(Job).where(Job.status == "running")
        if not all_running_lost:
            query = query.where(
                or_(
                    Job.heartbeat_at.is_(None),
                    Job.heartbeat_at < now - timedelta(seconds=heartbeat_timeout_s),
                )
            )
        for job in session.scalars(query.with_for_update(skip_locked=True)):
            if job.cancel_requested:
                job.status = "canceled"
                job.finished_at = now
                job.stage = None
                job.error_json = ErrorBody(
                    code="canceled", message="canceled by the user"
                ).model_dump_json()
                add_event(session, job.id, "canceled")
            elif job.attempts < MAX_ATTEMPTS:
                job.status = "queued"
                job.stage = None
                job.worker = None
                job.enqueued_at = now
                add_event(session, job.id, "queued", message="worker_lost")
                requeued.append((job.id, job.queue))
            else:
                job.status = "failed"
                job.stage = None
                job.finished_at = now
                job.error_json = ErrorBody(
                    code="internal_error",
                    message=(
                        f"the worker running this job was lost {job.attempts} times "
                        "(killed, out of memory, or its machine went away)"
                    ),
                    hint="The model may exhaust the worker's memory; try a lower memory_mb.",
                    details={"reason": "worker_lost", "attempts": job.attempts},
                ).model_dump_json()
                add_event(session, job.id, "failed", message="worker_lost")
                failed.append(job.id)
            if job.status != "queued":  # ended here: canceled, or failed worker_lost
                code = "canceled" if job.status == "canceled" else "internal_error"
                job_metrics.job_ended(
                    session,
                    status=job.status,
                    code=code,
                    created_at=job.created_at,
                    finished_at=now,
                )
        stale = now - timedelta(seconds=requeue_after_s)
        for job in session.scalars(
            select(Job)
            .where(
                Job.status == "queued",
                or_(Job.enqueued_at.is_(None), Job.enqueued_at < stale),
            )
            .with_for_update(skip_locked=True)
        ):
            job.enqueued_at = now
            requeued.append((job.id, job.queue))
    if requeued or failed:
        logger.warning("recovered jobs: requeued=%s failed=%s", requeued, failed)
    return Recovery(requeued=requeued, failed=failed)
