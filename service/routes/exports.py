"""`/v1/exports`: submit, read, follow, download, cancel and list export jobs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from persistence import records, retention, zip_index
from persistence.lifecycle import mark_unsent
from persistence.queue import enqueue_export, enqueue_webhook, queue_for
from schemas import JobList, JobPublic, JobSpec, JobStatus
from schemas.job import TERMINAL_STATUSES
from service import archives, jobs, listing, references, upload_checks
from service.deps import AppState, CallerDep, SessionDep, StateDep
from service.errors import (
    Conflict,
    Expired,
    InvalidRequest,
    NotFound,
    RateLimited,
    StorageQuotaExceeded,
    Unauthorized,
    UploadTooLarge,
    error_responses,
)
from service.streams import STREAM_TTL_S
from service.uploads import UPLOAD_BODY, receive_form, safe_filename

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/exports", tags=["exports"])

JOB_ID = Annotated[str, Field(max_length=64)]
_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
_EVENT_ID = re.compile(r"^[0-9]{1,18}$")
_HUGE = 10**18
"""Stands for any position or length of more digits (past every file; int() of thousands
of digits is refused by Python and slow)."""


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else _HUGE


def _job_response(job: JobPublic, status_code: int) -> JSONResponse:
    return JSONResponse(status_code=status_code, content=job.model_dump(mode="json"))


def _submit_in_db(
    state: AppState, form: Any, spec: JobSpec, caller: Any, index: zip_index.ZipIndex | None
) -> tuple[JobPublic, bool]:
    with state.sessions() as session, session.begin():
        submission = jobs.submit(
            session,
            state.store,
            form,
            spec,
            caller,
            max_concurrent_jobs=state.settings.max_concurrent_jobs,
            storage_quota_bytes=state.settings.storage_quota_bytes,
            fingerprint=state.fingerprint,
            lease=functools.partial(retention.lease, state.sessions),
        )
        if index is not None:  # a zip model's: its blob is leased, so its row is there
            zip_index.record(session, form.files["model"].sha256, index)
        job = jobs.get_job(session, submission.job.id, caller)
        public = records.to_public(job)
    return public, submission.enqueue


def _enqueue_after_commit(state: AppState, job: JobPublic) -> None:
    try:
        enqueue_export(state.celery, job.id, queue_for(job.options.device).value)
    except Exception:
        # The row is committed and stays queued: the reaper sends it once the broker is back.
        logger.exception("could not enqueue job %s; the reaper will retry", job.id)
        mark_unsent(state.sessions, job.id)


def _send_webhook_after_commit(state: AppState, job: JobPublic) -> None:
    try:
        enqueue_webhook(state.celery, job.id)
    except Exception:
        logger.exception("could not send the webhook of job %s; it stays pending", job.id)


@router.post(
    "",
    status_code=202,
    response_model=JobPublic,
    summary="Submit an export",
    openapi_extra={"requestBody": UPLOAD_BODY},
    responses=error_responses(
        InvalidRequest, UploadTooLarge, StorageQuotaExceeded, Unauthorized, RateLimited
    ),
)
async def create_export(request: Request, state: StateDep, caller: CallerDep) -> JSONResponse:
    """Upload a model (and optional inputs, weights, options, callback URL); answers 202
    with the job.

    An identical earlier success of the same caller answers at once with `cache_hit: true`;
    an identical job still in flight is returned instead of starting a second one. A key
    whose unexpired jobs hold its storage quota is refused (`storage_quota_exceeded`).
    """
    tmp_root = state.settings.data_dir / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=tmp_root, prefix="upload-"))
    try:
        settings = state.settings
        form = await receive_form(
            request, settings.upload_limits, directory, model_zip_limit=settings.model_zip_limit
        )
        if form.model_url is not None:  # lists the reference: off the event loop
            await run_in_threadpool(references.resolve, form, settings, caller, directory)
        spec = jobs.parse_job(form)
        # Reads the files (a zip's directory): off the event loop.
        check = functools.partial(
            upload_checks.validate_uploads,
            max_model_bytes=settings.max_model_bytes,
            max_directory_bytes=settings.max_zip_directory_bytes,
        )
        index = await run_in_threadpool(check, form, spec.options)
        public, enqueue = await run_in_threadpool(_submit_in_db, state, form, spec, caller, index)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if enqueue:
        await run_in_threadpool(_enqueue_after_commit, state, public)
        state.metrics.submissions.labels("queued").inc()
    else:
        state.metrics.submissions.labels("cache_hit" if public.cache_hit else "duplicate").inc()
    if public.cache_hit and public.webhook is not None:
        # Finished here, not by a worker: the API sends its completion callback.
        await run_in_threadpool(_send_webhook_after_commit, state, public)
    return _job_response(public, 202)


@router.get(
    "",
    response_model=JobList,
    summary="List your jobs",
    responses=error_responses(InvalidRequest, Unauthorized, RateLimited),
)
def list_exports(
    session: SessionDep,
    caller: CallerDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> JobList:
    """The caller's jobs as summaries, newest first, one page at a time."""
    page, next_cursor = listing.list_jobs(
        session, caller, status=status, limit=limit, cursor=cursor
    )
    return JobList(items=page, next_cursor=next_cursor)


@router.get(
    "/{job_id}",
    response_model=JobPublic,
    summary="Get a job",
    responses=error_responses(NotFound, Unauthorized, RateLimited),
)
async def get_export(job_id: str, state: StateDep, caller: CallerDep) -> Response:
    """The job: status, stage, stage events, options, error, artifacts, timestamps."""

    def read() -> str:
        with state.sessions() as session:
            return records.to_public(jobs.get_job(session, job_id, caller)).model_dump_json()

    # The hot path: one thread hop for the database, serialized once by pydantic-core
    # and not validated again by FastAPI.
    return Response(await run_in_threadpool(read), media_type="application/json")


@router.delete(
    "/{job_id}",
    response_model=JobPublic,
    summary="Cancel a job",
    responses={
        202: {"model": JobPublic, "description": "Running: the worker is stopping it."},
        **error_responses(NotFound, Conflict, Unauthorized, RateLimited),
    },
)
def cancel_export(job_id: str, session: SessionDep, caller: CallerDep) -> JSONResponse:
    """Cancel a queued job (200, canceled) or a running one (202, its sandbox is killed)."""
    with session.begin():
        job = jobs.cancel(session, job_id, caller)
        public = records.to_public(job)
    return _job_response(public, 200 if public.status == "canceled" else 202)


@router.get(
    "/{job_id}/events",
    summary="Follow a job (server-sent events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`stage` events (a StageEvent each, `id` = sequence number), "
            "then one `job` event with the final job.",
        },
        **error_responses(NotFound, Unauthorized, RateLimited),
    },
)
async def follow_export(
    job_id: str,
    state: StateDep,
    caller: CallerDep,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> EventSourceResponse:
    """Stage events as they happen, ending with the final job; resumable by Last-Event-ID.

    The job is reloaded when a notice says it has new events (Redis), at least every
    `events_safety_reload_s`; without notices every `events_poll_interval_s`.
    """

    def load(seq: int) -> tuple[list[Any], JobPublic | None, str]:
        with state.sessions() as session:
            job = jobs.get_job(session, job_id, caller)
            events = [(e.seq, records.event_to_public(e)) for e in job.events if e.seq > seq]
            final = records.to_public(job) if job.status in TERMINAL_STATUSES else None
            return events, final, job.status

    seq = _last_event_id(last_event_id)
    settings = state.settings
    with contextlib.ExitStack() as held:  # a 404 or a 429 below releases what is held
        changed = held.enter_context(state.hub.watch(job_id))  # before the first load
        first = await run_in_threadpool(load, seq)
        ticket = None
        if first[1] is None and caller.key_id is not None:  # as rate limits: keyed callers
            ticket = await run_in_threadpool(state.stream_limiter.acquire, caller.identity)
            held.callback(state.stream_limiter.release, caller.identity, ticket)
        resources = held.pop_all()  # from here on the stream's, released when it ends

    async def stream() -> AsyncIterator[ServerSentEvent]:
        nonlocal seq
        batch = first
        deadline = time.monotonic() + settings.events_max_duration_s
        refreshed = time.monotonic()
        try:
            while True:
                events, final, _ = batch
                for number, event in events:
                    seq = number
                    yield ServerSentEvent(
                        data=event.model_dump_json(), event="stage", id=str(number)
                    )
                if final is not None:
                    yield ServerSentEvent(data=final.model_dump_json(), event="job")
                    return
                if time.monotonic() > deadline:
                    return
                wait = (
                    settings.events_safety_reload_s
                    if state.hub.live
                    else settings.events_poll_interval_s
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
                changed.clear()
                if ticket is not None and time.monotonic() - refreshed > STREAM_TTL_S / 3:
                    refreshed = time.monotonic()
                    await run_in_threadpool(state.stream_limiter.refresh, caller.identity, ticket)
                batch = await run_in_threadpool(load, seq)
        finally:
            resources.close()

    return EventSourceResponse(stream(), ping=15)


def _last_event_id(header: str | None) -> int:
    """The sequence number to resume after; -1 without a header.

    Raises:
        InvalidRequest: not a sequence number (ASCII digits, at most 18).
    """
    if header is None or not header.strip():
        return -1
    if not _EVENT_ID.match(header.strip()):
        raise InvalidRequest(
            "Last-Event-ID must be the id of an event of this stream (a sequence number)",
            details={"field": "Last-Event-ID", "reason": "not_an_event_id"},
        )
    return int(header.strip())


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end) inclusive for a single `bytes=` range, or None for the whole file."""
    match = _RANGE.match(header.strip())
    if match is None or (not match.group(1) and not match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if first:
        start = _position(first)
        end = min(_position(last), size - 1) if last else size - 1
    else:
        length = _position(last)
        start, end = max(0, size - length), size - 1
    if start >= size or start > end:
        raise _RangeNotSatisfiable(size)
    return start, end


class _RangeNotSatisfiable(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


@router.get(
    "/{job_id}/artifacts/{name}",
    summary="Download an artifact",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}, "application/json": {}}},
        206: {"description": "The requested byte range."},
        416: {"description": "The range is outside the file."},
        **error_responses(NotFound, Conflict, Expired, Unauthorized, RateLimited),
    },
)
def download_artifact(
    job_id: str,
    name: str,
    session: SessionDep,
    state: StateDep,
    caller: CallerDep,
    range_header: Annotated[str | None, Header(alias="range", include_in_schema=False)] = None,
) -> Response:
    """The artifact's bytes, streamed, with `Range` support; only for finished jobs."""
    job = jobs.get_job(session, job_id, caller)
    artifact = jobs.find_artifact(session, job, name)
    size = artifact.size
    headers = {
        "Accept-Ranges": "bytes",
        "ETag": f'"{artifact.sha256}"',
        "Content-Disposition": f'attachment; filename="{artifact.name}"',
        "Cache-Control": "private, max-age=31536000, immutable",
    }
    try:
        byte_range = _parse_range(range_header, size) if range_header else None
    except _RangeNotSatisfiable:
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    if byte_range is None:
        body: Iterator[bytes] = state.store.read(artifact.sha256)
        headers["Content-Length"] = str(size)
        return StreamingResponse(body, media_type=artifact.media_type, headers=headers)
    start, end = byte_range
    body = state.store.read(artifact.sha256, start, end)
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(end - start + 1)
    return StreamingResponse(body, status_code=206, media_type=artifact.media_type, headers=headers)


def _upload_headers(name: str, sha256: str, size: int) -> dict[str, str]:
    return {
        "ETag": f'"{sha256}"',
        "Content-Disposition": f'attachment; filename="{safe_filename(name, "upload")}"',
        "Content-Length": str(size),
        # User bytes: never let a browser sniff them into HTML or script.
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, max-age=31536000, immutable",
    }


@router.get(
    "/{job_id}/uploads/{field}",
    summary="Download an uploaded file",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {
                "text/x-python": {},
                "application/zip": {},
                "application/octet-stream": {},
            },
            "description": "The file as uploaded: `model`, `inputs`, `weights` or `calibration`.",
        },
        **error_responses(NotFound, Expired, Unauthorized, RateLimited),
    },
)
def download_upload(
    job_id: str, field: str, session: SessionDep, state: StateDep, caller: CallerDep
) -> Response:
    """The bytes of the job's `model`, `inputs`, `weights` or `calibration` upload,
    streamed as stored.

    Nothing is parsed or unpickled: the API serves bytes. Available at any job status.
    """
    upload = jobs.find_upload(jobs.get_job(session, job_id, caller), field)
    size = state.store.size(upload.sha256)
    return StreamingResponse(
        state.store.read(upload.sha256),
        media_type=jobs.upload_media_type(upload.name),
        headers=_upload_headers(upload.name, upload.sha256, size),
    )


@router.get(
    "/{job_id}/uploads/model/files/{member:path}",
    summary="Download one file of an uploaded model zip",
    response_class=Response,
    responses={
        200: {"content": {"text/x-python": {}, "application/octet-stream": {}}},
        **error_responses(
            NotFound, UploadTooLarge, InvalidRequest, Expired, Unauthorized, RateLimited
        ),
    },
)
def download_upload_member(
    job_id: str, member: str, session: SessionDep, state: StateDep, caller: CallerDep
) -> Response:
    """One regular file of the uploaded model zip, by its path inside the archive (the
    `location.file` of an error), read where the upload's index puts it, extracting nothing.

    `not_found` for a path the archive does not hold or a `.py` model upload;
    `upload_too_large` for a member over 1 MiB.
    """
    upload = jobs.find_upload(jobs.get_job(session, job_id, caller), "model")
    if jobs.upload_media_type(upload.name) != "application/zip":
        raise NotFound(
            f"the model of job {job_id} is not a zip",
            details={"job_id": job_id, "member": member, "reason": "not_a_zip"},
        )
    name, data = archives.read_member(
        session,
        state.store,
        upload.sha256,
        member,
        job_id=job_id,
        max_directory_bytes=state.settings.max_zip_directory_bytes,
    )
    digest = hashlib.sha256(data).hexdigest()
    return Response(
        data,
        media_type=jobs.upload_media_type(name),
        headers=_upload_headers(name.rsplit("/", 1)[-1], digest, len(data)),
    )
