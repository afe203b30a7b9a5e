"""Configuration of the API process: one pydantic-settings class, `TORCHPORT_` prefix, read once.

Every setting is documented in `docs/configuration.md`. Unsafe or contradictory values
fail at start-up, not at the first request.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path.home() / ".torchport"
MAX_JOB_TIMEOUT_S = 24 * 3600
"""The largest `timeout_s` an export may ask for (schemas.ExportOptions)."""


class CommonSettings(BaseSettings):
    """What the API and the workers share: where the database, broker and store are."""

    model_config = SettingsConfigDict(env_prefix="TORCHPORT_", extra="ignore")

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR,
        description="Root of the embedded defaults (SQLite file, artifacts, broker folder).",
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default `sqlite:///<data_dir>/torchport.db`."
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker (`redis://…`); default kombu's filesystem transport "
        "under `<data_dir>/broker`, which needs no server.",
    )
    store_url: str | None = Field(
        default=None,
        description="Artifact store: a directory path or `file://…`, or `s3://bucket/prefix`; "
        "default `<data_dir>/artifacts`.",
    )
    broker_key_prefix: str | None = Field(
        default=None,
        description="Prefix of every Redis key the broker uses (several deployments, one Redis).",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="Endpoint of an S3-compatible store (MinIO, R2, …)."
    )
    broker_polling_interval_s: float = Field(
        default=0.05,
        gt=0,
        description="How often the filesystem broker looks for new tasks.",
    )
    visibility_timeout_s: int = Field(
        default=MAX_JOB_TIMEOUT_S + 3600,
        description="Redis redelivers an unacknowledged task after this long; must exceed "
        "the longest job.",
    )
    heartbeat_interval_s: float = Field(
        default=1.0, gt=0, description="How often a running job's worker reports it is alive."
    )
    heartbeat_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A running job whose worker was silent this long is re-queued once, "
        "then failed.",
    )

    @model_validator(mode="after")
    def _check_timeouts(self) -> Self:
        if self.visibility_timeout_s <= MAX_JOB_TIMEOUT_S:
            raise ValueError(
                "TORCHPORT_VISIBILITY_TIMEOUT_S must exceed the longest job time limit "
                f"({MAX_JOB_TIMEOUT_S} s), or Redis redelivers running jobs"
            )
        if self.heartbeat_timeout_s <= 3 * self.heartbeat_interval_s:
            raise ValueError(
                "TORCHPORT_HEARTBEAT_TIMEOUT_S must be over 3x TORCHPORT_HEARTBEAT_INTERVAL_S"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to SQLite in the data directory."""
        return self.database_url or f"sqlite:///{self.data_dir / 'torchport.db'}"

    @property
    def resolved_broker_url(self) -> str:
        """The broker URL; `filesystem://` means the embedded folder broker."""
        return self.broker_url or "filesystem://"

    @property
    def broker_dir(self) -> Path:
        """Folder of the embedded filesystem broker."""
        return self.data_dir / "broker"

    @property
    def resolved_store_url(self) -> str:
        """The artifact store location, defaulting to a directory in the data dir."""
        return self.store_url or str(self.data_dir / "artifacts")


class ServiceSettings(CommonSettings):
    """Settings of the API process (`torchport serve`, or uvicorn on `service.app:create_app`)."""

    max_model_bytes: int = Field(default=16 * 2**20, gt=0, description="Limit of `model`.")
    max_inputs_bytes: int = Field(default=256 * 2**20, gt=0, description="Limit of `inputs`.")
    max_weights_bytes: int = Field(default=4 * 2**30, gt=0, description="Limit of `weights`.")
    max_options_bytes: int = Field(default=64 * 2**10, gt=0, description="Limit of `options`.")
    rate_limit_per_minute: int = Field(
        default=600,
        gt=0,
        description="Requests per minute per API key (keyless loopback servers are not "
        "limited); one bucket in Redis for all API replicas when Redis is the broker.",
    )
    max_concurrent_jobs: int = Field(
        default=8, gt=0, description="Queued plus running jobs one API key may have."
    )
    events_poll_interval_s: float = Field(
        default=0.05,
        gt=0,
        description="How often an event stream looks for new stage events when no job notices "
        "arrive (the embedded broker; Redis not answering).",
    )
    events_safety_reload_s: float = Field(
        default=5.0,
        gt=0,
        description="With job notices over Redis: how often a stream reloads its job anyway, "
        "in case a notice was lost.",
    )
    max_streams_per_key: int = Field(
        default=16,
        gt=0,
        description="Event streams one API key may hold open at once (across API replicas "
        "when Redis is the broker); one more is refused with `rate_limited`.",
    )
    events_max_duration_s: float = Field(
        default=MAX_JOB_TIMEOUT_S + 600.0,
        gt=0,
        description="An event stream is closed after this long.",
    )
    reaper_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the API looks for lost jobs (dead workers, lost queue messages).",
    )
    requeue_after_s: float = Field(
        default=120.0,
        gt=0,
        description="A job still queued after this long is sent to the broker again "
        "(covers a broker that lost its messages).",
    )
    allow_remote_without_keys: bool = Field(
        default=False,
        description="Answer non-loopback (or proxied) clients with no API keys; by default a "
        "keyless app answers them `forbidden` 403.",
    )
    auto_migrate: bool = Field(
        default=True, description="Run the database migrations when the API starts."
    )

    @cached_property
    def upload_limits(self) -> dict[str, int]:
        """Per-field byte limits of the multipart upload."""
        return {
            "model": self.max_model_bytes,
            "inputs": self.max_inputs_bytes,
            "weights": self.max_weights_bytes,
            "options": self.max_options_bytes,
        }
