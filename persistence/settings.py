"""What the API and the workers share in their configuration: where the database, broker
and store are, heartbeats, the broker's visibility timeout. `TORCHPORT_` prefix, read once.

`service.settings.ServiceSettings` (the API) and `worker.settings.WorkerSettings` extend
it; every setting is documented in `docs/configuration.md`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.limits import MAX_TIMEOUT_S
from schemas.source import KEY_WILDCARD, parse_prefix

DEFAULT_DATA_DIR = Path.home() / ".torchport"


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
    checkpoint_sources: str = Field(
        default="",
        description="Comma-separated `s3://bucket/prefix/` under which a job may name its "
        "checkpoint by reference (`model_url`), read with this deployment's S3 credentials "
        "and `TORCHPORT_S3_ENDPOINT_URL`; `{key}` in a prefix stands for the caller's API "
        "key id. Empty: no references.",
    )
    broker_polling_interval_s: float = Field(
        default=0.05,
        gt=0,
        description="How long a consumer of the filesystem broker waits for a wake-up before "
        "it looks for new tasks anyway (producers wake consumers when they put one).",
    )
    visibility_timeout_s: int = Field(
        default=MAX_TIMEOUT_S + 3600,
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
        if self.visibility_timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(
                "TORCHPORT_VISIBILITY_TIMEOUT_S must exceed the longest job time limit "
                f"({MAX_TIMEOUT_S} s), or Redis redelivers running jobs"
            )
        if self.heartbeat_timeout_s <= 3 * self.heartbeat_interval_s:
            raise ValueError(
                "TORCHPORT_HEARTBEAT_TIMEOUT_S must be over 3x TORCHPORT_HEARTBEAT_INTERVAL_S"
            )
        for entry in self.allowed_sources:
            try:
                parse_prefix(entry.replace(KEY_WILDCARD, "key"))
            except ValueError as exc:
                raise ValueError(f"TORCHPORT_CHECKPOINT_SOURCES: {entry!r}: {exc}") from exc
        return self

    @property
    def allowed_sources(self) -> tuple[str, ...]:
        """The allow-listed prefixes of `checkpoint_sources`."""
        return tuple(e.strip() for e in self.checkpoint_sources.split(",") if e.strip())

    @classmethod
    def variables(cls) -> dict[str, FieldInfo]:
        """Every environment variable this class reads, with its field: a nested model
        (`WorkerSettings.sandbox`) is one variable per field of it, `TORCHPORT_SANDBOX_<NAME>`."""
        prefix = str(cls.model_config.get("env_prefix", ""))
        found: dict[str, FieldInfo] = {}
        for name, info in cls.model_fields.items():
            nested = info.annotation
            if isinstance(nested, type) and issubclass(nested, BaseModel):
                for sub, sub_info in nested.model_fields.items():
                    found[f"{prefix}{name}_{sub}".upper()] = sub_info
            else:
                found[f"{prefix}{name}".upper()] = info
        return found

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
