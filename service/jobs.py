"""What the endpoints do with jobs: submit (with the result cache), read, list, cancel.

Endpoints stay thin and call these; they run inside one transaction the caller commits,
and the caller enqueues only after the commit.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import from_json
from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session, selectinload

from persistence import job_metrics
from persistence.models import ApiKey, Artifact, Job, StageEventRow, utcnow
from persistence.queue import queue_for
from persistence.records import job_uploads, next_seq, record_spec
from persistence.store import ArtifactStore
from schemas import JobSpec
from schemas.job import TERMINAL_STATUSES, UPLOAD_ROLES
from schemas.outcomes import canceled, validation_items
from service import quotas
from service.auth import Caller
from service.errors import Conflict, Expired, InvalidRequest, NotFound
from service.uploads import UploadedForm

UPLOAD_MEDIA_TYPES = {".py": "text/x-python", ".zip": "application/zip"}


def upload_media_type(name: str) -> str:
    """Content type of an uploaded file (or zip member) by its name: the bytes as stored."""
    return UPLOAD_MEDIA_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def engine_fingerprint() -> str:
    """torchport and torch versions, read from package metadata (torch is never imported)."""
    versions = []
    for dist in ("torchport", "torch"):
        try:
            versions.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist}=unknown")
    return ";".join(versions)


def cache_key(spec: JobSpec, fingerprint: str) -> str:
    """SHA-256 over the uploads' digests, the options (all of them shape the result; the
    callback URL is the job's, not the options') and the versions. A calibration file
    counts only when there is one, so the keys of jobs without one are as they were."""
    uploads = spec.uploads
    fields: dict[str, object] = {
        "model": uploads.model.sha256,
        "inputs": uploads.inputs.sha256 if uploads.inputs else None,
        "weights": uploads.weights.sha256 if uploads.weights else None,
        "options": spec.options.model_dump(mode="json"),
        "engine": fingerprint,
    }
    if uploads.calibration is not None:
        fields["calibration"] = uploads.calibration.sha256
    material = json.dumps(
        fields,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def parse_job(form: UploadedForm) -> JobSpec:
    """The job the form describes, validated once, whole: its options (the `options`
    JSON field), its uploads and its callback URL (the `callback_url` field, or the
    deprecated `options.callback_url`).

    Raises:
        InvalidRequest: no model; options that are not a JSON object; a field the schema
            refuses. `details.errors` lists each field path (`options.verify.atol`,
            `callback_url`) with the pydantic error type.
    """
    model = form.files.get("model")
    if model is None:
        raise InvalidRequest(
            "the `model` file (or a `model_url`) is required", details={"field": "model"}
        )
    options: object = {}
    if form.options is not None and form.options.strip():
        try:
            options = from_json(form.options)
        except ValueError as exc:
            item = {"field": "options", "type": "json_invalid", "message": f"Invalid JSON: {exc}"}
            raise InvalidRequest("invalid options: options", details={"errors": [item]}) from exc
    callback_url = form.callback_url.strip() if form.callback_url else None
    described = {
        "options": options,
        "callback_url": callback_url or None,
        "uploads": {
            role: {"name": upload.filename, "sha256": upload.sha256, "size": upload.size}
            for role, upload in form.files.items()
        },
    }
    try:
        return JobSpec.model_validate(described)
    except ValidationError as exc:
        errors = validation_items(exc.errors(include_url=False))
        for error in errors:  # a check of the whole job (callback_url given twice)
            error["field"] = error["field"] or "callback_url"
        fields = ", ".join(e["field"] for e in errors)
        raise InvalidRequest(f"invalid options: {fields}", details={"errors": errors}) from exc


@dataclass
class Submission:
    """What `submit` decided: the job, and whether it must be sent to the broker."""

    job: Job
    enqueue: bool


def _new_id() -> str:
    return str(uuid.uuid4())


def _job_id_filter(job_id: str) -> ColumnElement[bool]:
    """`Job.id == job_id` for an id that can exist.

    Raises:
        NotFound: an id holding a NUL byte (no job has one, and PostgreSQL text cannot
            hold it: the query itself would fail).
    """
    if "\x00" in job_id:
        raise NotFound(
            "no such job: a job id never holds a NUL byte",
            hint="use the `id` of a job you submitted, as `POST /v1/exports` answered it",
            details={"job_id": job_id},
        )
    return Job.id == job_id


def owner_filter(caller: Caller) -> ColumnElement[bool]:
    return Job.owner_id.is_(None) if caller.key_id is None else Job.owner_id == caller.key_id


Lease = Callable[[Mapping[str, int | None]], None]
"""Commits a lease of blobs (digest → size) in a transaction of its own
(`persistence.retention.lease`)."""


def _store_uploads(store: ArtifactStore, form: UploadedForm) -> None:
    for upload in form.files.values():
        store.put_file(upload.path, sha256=upload.sha256, own=True)


def submit(
    session: Session,
    store: ArtifactStore,
    form: UploadedForm,
    spec: JobSpec,
    caller: Caller,
    *,
    max_concurrent_jobs: int,
    storage_quota_bytes: int,
    fingerprint: str,
    lease: Lease,
) -> Submission:
    """Record a job for an upload, or answer from the cache or an identical job in flight.

    The uploads are leased first (committed, so the collector keeps them), put into the
    store (content-addressed) only once every check passed, and before the row is
    written, so a committed job always finds its files. A cache hit leases the earlier
    job's artifacts and takes them only if that job has not expired meanwhile.

    Raises:
        RateLimited: the caller's key already has `max_concurrent_jobs` queued or running.
        StorageQuotaExceeded: the key's unexpired jobs hold `storage_quota_bytes` with
            this submission's new uploads (0: no quota).
    """
    uploads = {upload.sha256: upload.size for upload in form.files.values()}
    lease(uploads)
    key = cache_key(spec, fingerprint)
    owner = owner_filter(caller)
    if caller.key_id is not None:
        # One submission per key at a time, whichever API replica takes it: the in-flight
        # lookup, the concurrency and storage counts and the insert below cannot interleave.
        session.execute(select(ApiKey.id).where(ApiKey.id == caller.key_id).with_for_update())
    earlier = session.scalar(
        select(Job)
        .where(
            owner,
            Job.cache_key == key,
            Job.status.in_(("succeeded", "queued", "running")),
            Job.expired_at.is_(None),
        )
        .order_by(Job.created_at.desc())
        .limit(1)
        .options(selectinload(Job.artifacts))
    )
    if earlier is not None and earlier.status != "succeeded":
        # A double submission while the first is in flight: one job, not two.
        return Submission(job=earlier, enqueue=False)
    if earlier is not None:
        lease({a.sha256: a.size for a in earlier.artifacts})
        if session.scalar(select(Job.expired_at).where(Job.id == earlier.id)) is not None:
            earlier = None  # expired since it was found: its artifacts may be gone
    now = utcnow()
    job = Job(
        id=_new_id(),
        owner_id=caller.key_id,
        cache_key=key,
        queue=queue_for(spec.options.device).value,
        created_at=now,
        attempts=0,
        cancel_requested=False,
        webhook_attempts=0,
        webhook_status="pending" if spec.callback_url else None,
    )
    record_spec(job, spec)
    if earlier is not None:
        _store_uploads(store, form)
        job.status = "succeeded"
        job.cache_hit = True
        job.source_job_id = earlier.id
        job.started_at = now
        job.finished_at = now
        session.add(job)
        session.add(StageEventRow(job_id=job.id, seq=0, status="succeeded", at=now))
        for artifact in earlier.artifacts:
            session.add(
                Artifact(
                    job_id=job.id,
                    name=artifact.name,
                    sha256=artifact.sha256,
                    size=artifact.size,
                    media_type=artifact.media_type,
                    created_at=now,
                )
            )
        job_metrics.cache_hit(session)
        session.flush()
        return Submission(job=job, enqueue=False)
    # Limits are per key; a keyless server is loopback-only and its one user is not limited.
    if caller.key_id is not None:
        quotas.check_key_limits(
            session,
            caller.key_id,
            uploads,
            max_concurrent_jobs=max_concurrent_jobs,
            storage_quota_bytes=storage_quota_bytes,
        )
    _store_uploads(store, form)
    job.status = "queued"
    job.cache_hit = False
    job.enqueued_at = now
    session.add(job)
    session.add(StageEventRow(job_id=job.id, seq=0, status="queued", at=now))
    session.flush()
    return Submission(job=job, enqueue=True)


def get_job(session: Session, job_id: str, caller: Caller) -> Job:
    """The caller's job with its events and artifacts.

    Raises:
        NotFound: no such job, or it belongs to another key (never `forbidden`: ids of
            others' jobs are not confirmed).
    """
    job = session.scalar(
        select(Job)
        .where(_job_id_filter(job_id), owner_filter(caller))
        .options(selectinload(Job.events), selectinload(Job.artifacts))
    )
    if job is None:
        raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
    return job


def cancel(session: Session, job_id: str, caller: Caller) -> Job:
    """Cancel a queued job at once, or ask the worker of a running job to kill it.

    Raises:
        NotFound: as `get_job`.
        Conflict: the job already finished.
    """
    job = session.scalar(
        select(Job).where(_job_id_filter(job_id), owner_filter(caller)).with_for_update()
    )
    if job is None:
        raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
    if job.status in TERMINAL_STATUSES:
        raise Conflict(
            f"job {job_id} already {job.status}",
            details={"job_id": job_id, "status": job.status},
        )
    now = utcnow()
    job.cancel_requested = True
    if job.status == "queued":
        job.status = "canceled"
        job.finished_at = now
        job.error_json = canceled().model_dump_json()
        session.add(
            StageEventRow(job_id=job.id, seq=next_seq(session, job.id), status="canceled", at=now)
        )
        job_metrics.job_ended(
            session, status="canceled", code="canceled", created_at=job.created_at, finished_at=now
        )
    session.flush()
    return get_job(session, job_id, caller)


def events_after(session: Session, job_id: str, seq: int) -> list[StageEventRow]:
    """Stage events of a job with a sequence number above `seq`, in order."""
    return list(
        session.scalars(
            select(StageEventRow)
            .where(StageEventRow.job_id == job_id, StageEventRow.seq > seq)
            .order_by(StageEventRow.seq)
        )
    )


def find_artifact(session: Session, job: Job, name: str) -> Artifact:
    """An artifact of a finished job.

    Raises:
        Conflict: the job has not finished yet.
        NotFound: the job finished without an artifact of that name.
        Expired: the job's files are gone (its retention time passed).
    """
    if job.status not in TERMINAL_STATUSES:
        raise Conflict(
            f"job {job.id} is {job.status}: artifacts are ready when it finishes",
            details={"job_id": job.id, "status": job.status},
        )
    for artifact in job.artifacts:
        if artifact.name == name:
            _check_kept(job)
            return artifact
    raise NotFound(
        f"job {job.id} has no artifact {name!r}",
        details={"job_id": job.id, "artifact": name, "available": [a.name for a in job.artifacts]},
    )


def finished_artifacts(job: Job) -> list[Artifact]:
    """Every artifact of a finished job (none for a job canceled while queued).

    Raises:
        Conflict: the job has not finished yet.
        Expired: the job's files are gone (its retention time passed).
    """
    if job.status not in TERMINAL_STATUSES:
        raise Conflict(
            f"job {job.id} is {job.status}: artifacts are ready when it finishes",
            details={"job_id": job.id, "status": job.status},
        )
    _check_kept(job)
    return list(job.artifacts)


@dataclass(frozen=True)
class StoredUpload:
    """A file uploaded with a job: its form field, its (sanitized) name and its blob."""

    field: str
    name: str
    sha256: str


def find_upload(job: Job, field: str) -> StoredUpload:
    """The job's upload in `field` (one of `UPLOAD_ROLES`), at any status.

    Raises:
        NotFound: another field name, or nothing was uploaded in that field.
        Expired: the job's files are gone (its retention time passed).
    """
    uploads = job_uploads(job)
    ref = getattr(uploads, field) if field in UPLOAD_ROLES else None
    if ref is None:
        raise NotFound(
            f"job {job.id} has no {field!r} upload",
            details={
                "job_id": job.id,
                "upload": field,
                "available": [f for f in UPLOAD_ROLES if getattr(uploads, f) is not None],
            },
        )
    _check_kept(job)
    return StoredUpload(field=field, name=ref.name, sha256=ref.sha256)


def _check_kept(job: Job) -> None:
    """Raises Expired when the collector let the job's files go."""
    if job.expired_at is not None:
        raise Expired(
            f"the files of job {job.id} expired and were deleted",
            details={"job_id": job.id, "expired_at": job.expired_at.isoformat()},
        )
