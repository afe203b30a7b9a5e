"""State changes of a job after submission: claimed by a worker, stage events, heartbeats,
finished; and recovery of jobs whose worker died or whose queue message was lost.

Every change is a conditional UPDATE on the job row, so two workers (a redelivered
message, a re-queued job) can never both run one job, and a finished job is never redone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from schemas import ErrorBody
from service.database import transaction
from service.jobs import next_seq
from service.models import Artifact, Job, StageEventRow, utcnow

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 2
"""A job whose worker died is re-queued once; the second loss fails it."""


@dataclass(frozen=True)
class ClaimedJob:
    """What a worker needs to run a job it claimed."""

    id: str
    options_json: str
    attempt: int
    model_sha256: str
    model_name: str
    inputs_sha256: str | None
    inputs_name: str | None
    weights_sha256: str | None
    weights_name: str | None


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
) -> None:
    """Append a stage event to a job."""
    session.add(
        StageEventRow(
            job_id=job_id,
            seq=next_seq(session, job_id),
            stage=stage,
            status=status,
            fraction=fraction,
            message=message,
            at=utcnow(),
        )
    )


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
        return ClaimedJob(
            id=job.id,
            options_json=job.options_json,
            attempt=job.attempts,
            model_sha256=job.model_sha256,
            model_name=job.model_name,
            inputs_sha256=job.inputs_sha256,
            inputs_name=job.inputs_name,
            weights_sha256=job.weights_sha256,
            weights_name=job.weights_name,
        )


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
            add_event(session, job_id, status, stage=stage, fraction=fraction, message=message)


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
) -> bool:
    """Record the end of a running job; False if it was no longer this worker's."""
    with transaction(sessions) as session:
        now = utcnow()
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.worker == worker)
            .values(
                status=status,
                stage=None,
                finished_at=now,
                error_json=error.model_dump_json() if error else None,
            )
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return False
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
    with transaction(sessions) as session:
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_(("queued", "running")))
            .values(
                status="failed",
                stage=None,
                finished_at=utcnow(),
                error_json=error.model_dump_json(),
            )
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return False
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
