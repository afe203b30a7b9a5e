"""Database tables (SQLAlchemy 2): jobs, their stage events and artifacts, API keys, the
leases of stored blobs and where the files of model zips lie in them, the environments
workers describe when they start, the worker processes alive, and the totals of finished
jobs `/metrics` shows.

The job row is the source of truth for a job's status; the broker only carries its id.
Schema changes go through Alembic (`service/migrations/`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    """Now, timezone-aware in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored in UTC and read back timezone-aware (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every table."""


class ApiKey(Base):
    """An API key; only the SHA-256 of the secret is stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    webhook_secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Job(Base):
    """One export job."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("api_keys.id"), nullable=True
    )
    status: Mapped[str] = mapped_column(String(16), default="queued")
    stage: Mapped[str | None] = mapped_column(String(16), nullable=True)
    options_json: Mapped[str] = mapped_column(Text)
    """The job's `ExportOptions` (`JobSpec.options`) as JSON."""
    callback_url: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    error_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    cache_key: Mapped[str] = mapped_column(String(64))
    cache_hit: Mapped[bool] = mapped_column(Boolean, default=False)
    source_job_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    queue: Mapped[str] = mapped_column(String(16), default="cpu")
    model_sha256: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(255))
    inputs_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    inputs_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    weights_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    weights_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    calibration_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    calibration_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    webhook_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    webhook_attempts: Mapped[int] = mapped_column(Integer, default=0)
    webhook_last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    webhook_last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    webhook_delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    """When the collector let the job's uploads and artifacts go (`persistence.retention`);
    the row and its status stay."""

    events: Mapped[list[StageEventRow]] = relationship(
        order_by="StageEventRow.seq", cascade="all, delete-orphan", lazy="raise"
    )
    artifacts: Mapped[list[Artifact]] = relationship(
        order_by="Artifact.name", cascade="all, delete-orphan", lazy="raise"
    )

    __table_args__ = (
        Index("ix_jobs_owner_created", "owner_id", "created_at", "id"),
        Index("ix_jobs_status", "status"),
        # Queue depth and the oldest queued job per queue, at every scrape of /metrics.
        Index("ix_jobs_status_queue_created", "status", "queue", "created_at"),
        Index("ix_jobs_cache_key", "cache_key"),
        # The collector asks, per blob, whether a job still refers to it.
        Index("ix_jobs_model_sha256", "model_sha256"),
        Index("ix_jobs_inputs_sha256", "inputs_sha256"),
        Index("ix_jobs_weights_sha256", "weights_sha256"),
        Index("ix_jobs_calibration_sha256", "calibration_sha256"),
    )


class StageEventRow(Base):
    """A stage change of a job; the event stream replays these in `seq` order."""

    __tablename__ = "stage_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str | None] = mapped_column(String(16), nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (Index("ix_stage_events_job_seq", "job_id", "seq", unique=True),)


class Artifact(Base):
    """A file a job produced, stored content-addressed by its SHA-256."""

    __tablename__ = "artifacts"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (Index("ix_artifacts_sha256", "sha256"),)


class Blob(Base):
    """A blob of the store and its lease: the last time a writer (a submission, a worker
    storing artifacts, a cache hit) said it was about to rely on it. The collector deletes
    a blob only together with this row (`persistence.retention`)."""

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """Bytes; null for uploads stored before blobs were recorded (migration 0004)."""
    leased_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ZipMember(Base):
    """Where one regular file of an uploaded model zip lies in its blob, as the one parse
    of the zip's central directory at upload found it (`persistence.zip_index`): a file of
    the zip is read from here, never by parsing the directory again. A blob's index
    follows from its bytes alone, so it is kept, and deleted, with the blob's row."""

    __tablename__ = "zip_members"

    blob_sha256: Mapped[str] = mapped_column(
        String(64), ForeignKey("blobs.sha256", ondelete="CASCADE"), primary_key=True
    )
    path_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 of the member's path as the engine unpacks it: a zip's name may be 64 KiB,
    more than a B-tree index entry holds."""
    header_offset: Mapped[int] = mapped_column(BigInteger)
    compress_size: Mapped[int] = mapped_column(BigInteger)
    file_size: Mapped[int] = mapped_column(BigInteger)
    compress_type: Mapped[int] = mapped_column(Integer)
    flag_bits: Mapped[int] = mapped_column(Integer)
    crc: Mapped[int] = mapped_column(BigInteger)


class WorkerEnvironmentRow(Base):
    """The environment (Python, torch, installed libraries) a worker described at start.

    One row per queue and host, replaced when a worker of that host starts again; the
    API answers each queue's most recent (`GET /v1/environment`).
    """

    __tablename__ = "worker_environments"

    queue: Mapped[str] = mapped_column(String(16), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), primary_key=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    environment_json: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_worker_environments_recorded", "queue", "recorded_at"),)


class WorkerProcess(Base):
    """An export worker process, alive while `seen_at` is recent: it says so every
    heartbeat interval and deletes its row when it stops (`persistence.worker_processes`).
    It is busy while a running job names it as its `worker`."""

    __tablename__ = "worker_processes"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The process's identity, as running jobs record it in `jobs.worker`."""
    hostname: Mapped[str] = mapped_column(String(255))
    queues: Mapped[str] = mapped_column(String(255))
    """The queues it consumes, comma-separated."""
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class MetricTotal(Base):
    """One sample of a counter or histogram of finished jobs, added to by whichever
    process ends a job, in the transaction that ends it (`persistence.job_metrics`), so
    every API replica serves the same totals and none is counted twice."""

    __tablename__ = "metric_totals"

    family: Mapped[str] = mapped_column(String(64), primary_key=True)
    sample: Mapped[str] = mapped_column(String(16), primary_key=True)
    """`total` (a counter), or `bucket`, `sum`, `count` (a histogram; a bucket row counts
    the observations of its own bucket only, not those below it)."""
    labels: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The label values as JSON with sorted keys (`le` for a bucket)."""
    value: Mapped[float] = mapped_column(Double, default=0.0)
