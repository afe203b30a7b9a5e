"""What the API and the workers both read of a job: its public view, its next event number,
an artifact's media type. The API's own job operations (submit, list, cancel) are in
`service.jobs`; the worker's writes are in `persistence.lifecycle`."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from persistence.models import Job, StageEventRow
from schemas import (
    ArtifactRef,
    ErrorBody,
    ExportOptions,
    JobPublic,
    JobSpec,
    JobUploads,
    StageEvent,
    SubmittedOptions,
    UploadRef,
    WebhookDelivery,
)

MEDIA_TYPES = {".json": "application/json", ".pt2": "application/zip"}
"""Content types of artifacts by suffix; anything else is application/octet-stream."""


def media_type_for(name: str) -> str:
    """Content type of an artifact by its name."""
    return MEDIA_TYPES.get(Path(name).suffix, "application/octet-stream")


def load_job(session: Session, job_id: str) -> Job | None:
    """Any job by id with its events and artifacts (workers; no owner check)."""
    return session.scalar(
        select(Job)
        .where(Job.id == job_id)
        .options(selectinload(Job.events), selectinload(Job.artifacts))
    )


def record_spec(job: Job, spec: JobSpec) -> None:
    """Write a job's description into its row (the columns are the stored `JobSpec`)."""
    job.options_json = spec.options.model_dump_json()
    job.callback_url = spec.callback_url
    uploads = spec.uploads
    job.model_sha256, job.model_name = uploads.model.sha256, uploads.model.name
    job.inputs_sha256 = uploads.inputs.sha256 if uploads.inputs else None
    job.inputs_name = uploads.inputs.name if uploads.inputs else None
    job.weights_sha256 = uploads.weights.sha256 if uploads.weights else None
    job.weights_name = uploads.weights.name if uploads.weights else None
    job.calibration_sha256 = uploads.calibration.sha256 if uploads.calibration else None
    job.calibration_name = uploads.calibration.name if uploads.calibration else None


def job_uploads(job: Job) -> JobUploads:
    """A job's uploaded files, read back from its row."""

    def ref(name: str | None, sha256: str | None) -> UploadRef | None:
        return None if name is None or sha256 is None else UploadRef(name=name, sha256=sha256)

    model = ref(job.model_name, job.model_sha256)
    assert model is not None, "a job row always has its model"
    return JobUploads(
        model=model,
        inputs=ref(job.inputs_name, job.inputs_sha256),
        weights=ref(job.weights_name, job.weights_sha256),
        calibration=ref(job.calibration_name, job.calibration_sha256),
    )


def job_spec(job: Job) -> JobSpec:
    """A job's description, read back from its row: the one typed `JobSpec` a worker
    runs (parsed once, here; the API validated it when the job was submitted)."""
    return JobSpec(
        uploads=job_uploads(job),
        options=ExportOptions.model_validate_json(job.options_json),
        callback_url=job.callback_url,
    )


def to_public(job: Job) -> JobPublic:
    """The API view of a job whose events and artifacts are loaded."""
    webhook = None
    if job.webhook_status is not None:
        webhook = WebhookDelivery(
            status=job.webhook_status,
            attempts=job.webhook_attempts,
            last_status_code=job.webhook_last_status_code,
            last_error=job.webhook_last_error,
            delivered_at=job.webhook_delivered_at,
        )
    return JobPublic(
        id=job.id,
        status=job.status,
        stage=job.stage,
        stages=[event_to_public(e) for e in job.events],
        options=SubmittedOptions.model_validate(
            {**json.loads(job.options_json), "callback_url": job.callback_url}
        ),
        callback_url=job.callback_url,
        error=ErrorBody.model_validate_json(job.error_json) if job.error_json else None,
        artifacts=[
            ArtifactRef(name=a.name, size=a.size, sha256=a.sha256, media_type=a.media_type)
            for a in job.artifacts
        ],
        cache_hit=job.cache_hit,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempts=job.attempts,
        webhook=webhook,
        model_name=job.model_name,
        inputs_name=job.inputs_name,
        weights_name=job.weights_name,
        calibration_name=job.calibration_name,
        expired_at=job.expired_at,
    )


def event_to_public(row: StageEventRow) -> StageEvent:
    """A stored stage event as the API shows it."""
    return StageEvent(
        stage=row.stage,
        status=row.status,
        at=row.at,
        fraction=row.fraction,
        message=row.message,
    )


def next_seq(session: Session, job_id: str) -> int:
    """The sequence number the next stage event of a job gets."""
    current = session.scalar(
        select(func.max(StageEventRow.seq)).where(StageEventRow.job_id == job_id)
    )
    return 0 if current is None else current + 1
