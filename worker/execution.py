"""Running one job on a worker: claim it, fetch its uploads, run the sandbox while
streaming stage events and heartbeats, store the artifacts, finish the row.

The Celery task (`worker.tasks`) only adds retries and bookkeeping around `execute`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session, sessionmaker

from persistence import retention
from persistence.database import make_engine, make_session_factory, transaction
from persistence.lifecycle import ClaimedJob, StoredArtifact, claim, finish, heartbeat, record_stage
from persistence.models import Job
from persistence.notices import make_publisher, publish_after_commit
from persistence.records import media_type_for
from persistence.sources import SourceError
from persistence.store import ArtifactStore, StoreError, open_store, sha256_file
from schemas import ErrorBody, ReportDocument, UploadRef
from schemas.outcomes import canceled
from worker import references
from worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

STORE_ERRORS = (StoreError, ConnectionError, TimeoutError)
"""Errors of the store (fetching an upload while the job is staged): the task retries."""

_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PROGRESS_MIN_INTERVAL_S = 0.5
"""Progress within one stage is written at most this often; stage changes always."""


class Runner(Protocol):
    """What the worker needs of `worker.sandbox.SandboxRunner`."""

    def run(
        self,
        job: Any,
        *,
        on_progress: Callable[[Any], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Any:
        """Run one job to completion; returns a SandboxResult."""
        ...

    def close(self) -> None:
        """Stop the zygote."""
        ...


@dataclass
class WorkerContext:
    """What a worker process builds once: database, store, sandbox runner, identity."""

    settings: WorkerSettings
    engine: Engine
    sessions: sessionmaker[Session]
    store: ArtifactStore
    identity: str
    _runner: Runner | None = None
    _runner_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(cls, settings: WorkerSettings) -> WorkerContext:
        """Connect to the database and the store named by `settings`."""
        engine = make_engine(settings.resolved_database_url)
        sessions = make_session_factory(engine)
        publisher = make_publisher(
            settings.resolved_broker_url, settings.broker_key_prefix, settings.data_dir
        )
        if publisher is not None:  # following clients see this worker's events at once
            publish_after_commit(sessions, publisher)
        return cls(
            settings=settings,
            engine=engine,
            sessions=sessions,
            store=open_store(settings.resolved_store_url, s3_endpoint_url=settings.s3_endpoint_url),
            identity=f"{settings.worker_name}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        )

    def runner(self) -> Runner:
        """The process's one sandbox runner (a warm zygote), started on first use."""
        with self._runner_lock:
            if self._runner is None:
                from worker.sandbox import SandboxRunner

                runner = SandboxRunner(self.settings.sandbox_settings())
                runner.start()
                self._runner = runner
            return self._runner

    def close(self) -> None:
        """Stop the runner and release connections."""
        with self._runner_lock:
            if self._runner is not None:
                self._runner.close()
                self._runner = None
        self.engine.dispose()


class _Watcher(threading.Thread):
    """Heartbeats the job and turns a cancel request into the sandbox's cancel event."""

    def __init__(self, context: WorkerContext, job_id: str) -> None:
        super().__init__(name=f"watch-{job_id}", daemon=True)
        self.context = context
        self.job_id = job_id
        self.cancel = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        interval = self.context.settings.heartbeat_interval_s
        while not self._halt.wait(interval):
            try:
                if heartbeat(self.context.sessions, self.job_id, self.context.identity):
                    self.cancel.set()
            except Exception:
                # A database hiccup must not kill the job; the next beat tries again.
                logger.warning("heartbeat of %s failed", self.job_id, exc_info=True)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class _ProgressRecorder:
    """Writes the sandbox's progress reports as stage events, throttled within a stage."""

    def __init__(self, context: WorkerContext, job_id: str) -> None:
        self.context = context
        self.job_id = job_id
        self._stage: str | None = None
        self._last = 0.0

    def __call__(self, progress: Any) -> None:
        stage = getattr(progress, "stage", None)
        if stage is None:
            return
        fraction = getattr(progress, "fraction", None)
        message = getattr(progress, "message", None) or None
        now = time.monotonic()
        changed = stage != self._stage
        if not changed and now - self._last < PROGRESS_MIN_INTERVAL_S:
            return
        self._stage = stage
        self._last = now
        try:
            record_stage(
                self.context.sessions,
                self.job_id,
                self.context.identity,
                stage=stage,
                status="started" if changed else "progress",
                fraction=fraction,
                message=message,
            )
        except Exception:
            logger.warning("could not record progress of %s", self.job_id, exc_info=True)


@dataclass(frozen=True)
class StoredUpload:
    """An upload of a claimed job, fetched from the store straight into the job's
    staging directory when the sandbox stages it (`worker.sandbox.UploadSource`)."""

    store: ArtifactStore
    ref: UploadRef

    @property
    def name(self) -> str:
        return self.ref.name

    def copy_to(self, target: Path) -> None:
        self.store.fetch(self.ref.sha256, target)


def sandbox_job(context: WorkerContext, claimed: ClaimedJob, job_dir: Path) -> Any:
    """The sandbox's job for a claimed job: its typed options (never re-validated) and
    its uploads as store blobs the sandbox fetches into the job's staging (a checkpoint
    named by reference: its objects, read from S3 into a zip there)."""
    from worker.sandbox import SandboxJob

    uploads = claimed.spec.uploads
    settings = context.settings
    model: Any = StoredUpload(context.store, uploads.model)
    if references.is_reference(uploads.model):
        model = references.ReferencedCheckpoint(
            context.store,
            uploads.model,
            settings.allowed_sources,
            claimed.owner,
            settings.s3_endpoint_url,
        )
    return SandboxJob(
        model=model,
        inputs=StoredUpload(context.store, uploads.inputs) if uploads.inputs else None,
        weights=StoredUpload(context.store, uploads.weights) if uploads.weights else None,
        options=claimed.spec.options,
        job_dir=job_dir,
        calibration=(
            StoredUpload(context.store, uploads.calibration) if uploads.calibration else None
        ),
    )


def store_artifacts(
    store: ArtifactStore,
    artifacts: dict[str, Path],
    max_bytes: int,
    digests: dict[str, str] | None = None,
    *,
    lease: Callable[[Mapping[str, int | None]], None],
) -> list[StoredArtifact]:
    """Put the sandbox's outputs in the store; names and sizes are checked (untrusted).

    `digests`: the SHA-256 the runner computed of each artifact as it copied it out of
    the job's reach (`report.artifacts`). Such a file is the worker's own private copy,
    and the store takes it as it is (`put_file(own=True)`: linked under that digest,
    neither copied nor hashed again) where it is a regular file of this process's uid
    with no other link; anything else is copied, hashed and checked against its digest.

    `lease` (`persistence.retention.lease`) is given every digest before anything is put:
    the store skips bytes it holds, and the collector must not delete them meanwhile."""
    kept: dict[str, tuple[Path, str, int]] = {}
    for name, path in sorted(artifacts.items()):
        if not _ARTIFACT_NAME.match(name) or not path.is_file() or path.is_symlink():
            logger.warning("dropping artifact %r: bad name or not a regular file", name)
            continue
        size = path.stat().st_size
        if size > max_bytes:
            raise ArtifactTooLarge(name, size, max_bytes)
        digest = (digests or {}).get(name) or sha256_file(path)[0]
        kept[name] = (path, digest, size)
    lease({digest: size for _, digest, size in kept.values()})
    stored = []
    for name, (path, digest, _) in kept.items():
        sha256, size = store.put_file(path, (digests or {}).get(name), own=True)
        if sha256 != digest:  # changed since hashed here: lease what was stored, if still there
            lease({sha256: size})
            if not store.exists(sha256):
                raise StoreError(f"artifact {name} changed while it was stored")
        stored.append(
            StoredArtifact(name=name, sha256=sha256, size=size, media_type=media_type_for(name))
        )
    return stored


class ArtifactTooLarge(Exception):
    """A job produced a file over `max_artifact_bytes`."""

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(f"{name} is {size} bytes, over the limit of {limit}")
        self.name = name
        self.size = size
        self.limit = limit


def _final_status(error: ErrorBody | None, canceled: bool) -> str:
    if error is None:
        return "succeeded"
    if error.code == "canceled" or canceled:
        return "canceled"
    return "failed"


def release(context: WorkerContext, job_id: str) -> None:
    """Give a claimed job back to the queue after an infrastructure error (before a retry)."""
    with transaction(context.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.worker == context.identity)
            .values(status="queued", stage=None, worker=None, attempts=Job.attempts - 1)
        )


def execute(context: WorkerContext, job_id: str) -> str | None:
    """Run job `job_id` if it is still queued; returns its final status, or None if skipped.

    Infrastructure errors (database, store) propagate for the task to retry; anything
    the sandbox reports, including its own crashes, ends the job.
    """
    claimed = claim(context.sessions, job_id, context.identity)
    if claimed is None:
        logger.info("job %s is not queued any more; nothing to do", job_id)
        return None
    root = context.settings.resolved_work_dir / job_id
    shutil.rmtree(root, ignore_errors=True)
    job_dir = root / "job"
    job_dir.mkdir(parents=True)
    watcher = _Watcher(context, job_id)
    watcher.start()  # heartbeats from the claim on: a large download is not a dead worker
    try:
        try:
            result = context.runner().run(
                sandbox_job(context, claimed, job_dir),
                on_progress=_ProgressRecorder(context, job_id),
                cancel=watcher.cancel,
            )
            error: ErrorBody | None = result.error
            artifacts = dict(result.artifacts)
            report: ReportDocument | None = result.report
        except STORE_ERRORS:
            raise  # the store (fetching an upload): the task retries
        except SourceError as exc:  # a referenced checkpoint changed or cannot be read
            error, artifacts, report = references.source_error(exc), {}, None
        except Exception as exc:
            logger.exception("the sandbox runner failed on job %s", job_id)
            error = ErrorBody(
                code="internal_error",
                message="the sandbox runner failed: this is a bug in torchport",
                details={"type": type(exc).__name__, "reason": str(exc)[:500]},
            )
            artifacts, report = {}, None
        try:
            digests = {a.name: a.sha256 for a in report.artifacts} if report else {}
            stored = store_artifacts(
                context.store,
                artifacts,
                context.settings.max_artifact_bytes,
                digests,
                lease=functools.partial(retention.lease, context.sessions),
            )
        except ArtifactTooLarge as exc:
            error = ErrorBody(
                code="internal_error",
                message=str(exc),
                details={"reason": "artifact_too_large", "artifact": exc.name, "limit": exc.limit},
            )
            stored = []
        status = _final_status(error, watcher.cancel.is_set())
        if status == "canceled":
            error = canceled()
        finished = finish(
            context.sessions,
            job_id,
            context.identity,
            status=status,
            error=error,
            artifacts=stored,
            report=report,
        )
        return status if finished else None
    finally:
        watcher.stop()
        shutil.rmtree(root, ignore_errors=True)
