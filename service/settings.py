"""Configuration of the API process: one pydantic-settings class, `TORCHPORT_` prefix, read once.

Every setting is documented in `docs/configuration.md`. Unsafe or contradictory values
fail at start-up, not at the first request.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property
from typing import Annotated

from pydantic import Field, IPvAnyNetwork, SecretStr, field_validator
from pydantic_settings import NoDecode

from persistence.settings import CommonSettings
from schemas.limits import CALLBACK_URL_MAX_LENGTH, MAX_TIMEOUT_S
from schemas.source import URL_MAX_LENGTH
from service.archives import MAX_ZIP_DIRECTORY_BYTES


class ServiceSettings(CommonSettings):
    """Settings of the API process (`torchport serve`, or uvicorn on `service.app:create_app`)."""

    max_model_bytes: int = Field(default=16 * 2**20, gt=0, description="Limit of `model`.")
    max_inputs_bytes: int = Field(default=256 * 2**20, gt=0, description="Limit of `inputs`.")
    max_weights_bytes: int = Field(default=4 * 2**30, gt=0, description="Limit of `weights`.")
    max_calibration_bytes: int = Field(
        default=512 * 2**20, gt=0, description="Limit of `calibration`."
    )
    max_checkpoint_bytes: int = Field(
        default=20 * 2**30,
        gt=0,
        description="Limit of `model` when it is a checkpoint zip (a `save_pretrained` "
        "directory, its weights inside). A `.zip` model is received up to the larger of this "
        "and `TORCHPORT_MAX_MODEL_BYTES`; one that is not a checkpoint is then held to "
        "`TORCHPORT_MAX_MODEL_BYTES`.",
    )
    max_options_bytes: int = Field(default=64 * 2**10, gt=0, description="Limit of `options`.")
    max_zip_directory_bytes: int = Field(
        default=MAX_ZIP_DIRECTORY_BYTES,
        gt=0,
        description="Limit of a model zip's central directory (its names, extra fields and "
        "comments), told by its end record before it is read: a zip over it is refused at "
        'upload with `zip_too_large` (`details.limit = "directory"`). The contract\'s '
        "10,000 entries bound the directory in entries, not in bytes.",
    )
    rate_limit_per_minute: int = Field(
        default=600,
        gt=0,
        description="Requests per API key in any minute (keyless loopback servers are not "
        "limited); one count in Redis for all API replicas when Redis is the broker.",
    )
    auth_failures_per_minute: int = Field(
        default=30,
        gt=0,
        description="Failed authentications (an Authorization header with no valid key) one "
        "client address may make per minute on average: each one counts for "
        "`TORCHPORT_AUTH_FAILURES_BURST` / this many minutes (40 s by default); over the "
        "burst, that address's failures are answered `rate_limited` 429 (a valid key from it "
        "is still answered). One count in Redis for all API replicas when Redis is the "
        "broker. The address is the connection's peer, or behind "
        "`TORCHPORT_TRUSTED_PROXIES` the first hop that is not one of them.",
    )
    auth_failures_burst: int = Field(
        default=20,
        gt=0,
        description="Failed authentications one client address may make at once; one more "
        "waits until the oldest of them stops counting.",
    )
    trusted_proxies: Annotated[list[IPvAnyNetwork], NoDecode] = Field(
        default=[],
        description="Addresses or CIDR ranges of the reverse proxies in front of the API "
        "(comma-separated, e.g. `10.20.0.0/24, 10.20.9.4`); empty by default: no proxy is "
        "trusted. Only a connection from one of them has its `X-Forwarded-For` read, walked "
        "from the right over the trusted hops: the first hop that is not one of them is the "
        "client address the failed-authentication limit counts. Every host in these ranges "
        "can name any client address, so name the proxies only.",
    )
    max_concurrent_jobs: int = Field(
        default=8, gt=0, description="Queued plus running jobs one API key may have."
    )
    storage_quota_bytes: int = Field(
        default=32 * 2**30,
        ge=0,
        description="Bytes one API key may hold in the store: each distinct upload and "
        "artifact of its unexpired jobs, once; a submission that would go over it is refused "
        "with `storage_quota_exceeded`. 0: no quota.",
    )
    retention_hours: float = Field(
        default=168.0,
        ge=0,
        description="A finished job's uploads and artifacts are deleted this long after it "
        "finished (the job stays, `expired_at` set; its files answer `expired`); a cache hit "
        "is a new job, holding the same files for as long again. 0: keep them forever.",
    )
    gc_interval_s: float = Field(
        default=3600.0,
        gt=0,
        description="How often the API expires jobs and deletes the blobs no unexpired job "
        "refers to (as `torchport gc` does).",
    )
    events_poll_interval_s: float = Field(
        default=0.05,
        gt=0,
        description="How often an event stream looks for new stage events when no job notices "
        "arrive (Redis not answering; an embedded data directory whose path is too long for "
        "its notice socket).",
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
        default=MAX_TIMEOUT_S + 600.0,
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
    metrics_token: SecretStr | None = Field(
        default=None,
        description="The bearer token `/metrics` needs (`Authorization: Bearer <token>`), 32 "
        "or more characters; API keys do not open it, and failed tries count as failed "
        "authentications. Unset (or empty): with API keys configured, `/metrics` answers "
        "only clients on this machine that do not come through a proxy (others get "
        '`forbidden`, `details.reason = "metrics_token_not_set"`); without keys, as any '
        "route.",
    )
    metrics_refresh_interval_s: float = Field(
        default=15.0,
        gt=0,
        description="How often the API reads the database-backed metrics into the snapshot "
        "`/metrics` is answered from (a scrape never queries the database).",
    )

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _metrics_token_is_long_or_unset(cls, value: object) -> object:
        if value == "":
            return None  # compose passes an unset variable as empty
        secret = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(secret, str) and len(secret) < 32:
            raise ValueError("TORCHPORT_METRICS_TOKEN must be 32 or more characters")
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_proxies(cls, value: object) -> object:
        # The environment holds one comma-separated string, not JSON.
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_not_everyone(cls, value: list[IPvAnyNetwork]) -> list[IPvAnyNetwork]:
        if any(network.prefixlen == 0 for network in value):
            raise ValueError(
                "TORCHPORT_TRUSTED_PROXIES must name the proxies, not every address: "
                "anyone could then choose the client address the API counts"
            )
        return value

    @property
    def retention(self) -> timedelta | None:
        """How long a finished job's files are kept; None: forever."""
        return timedelta(hours=self.retention_hours) if self.retention_hours > 0 else None

    @cached_property
    def upload_limits(self) -> dict[str, int]:
        """Per-field byte limits of the multipart upload."""
        return {
            "model": self.max_model_bytes,
            "inputs": self.max_inputs_bytes,
            "weights": self.max_weights_bytes,
            "calibration": self.max_calibration_bytes,
            "options": self.max_options_bytes,
            "callback_url": 4 * CALLBACK_URL_MAX_LENGTH,
            "model_url": 4 * URL_MAX_LENGTH,
        }

    @property
    def model_zip_limit(self) -> int:
        """What a `.zip` model may stream in before it is known to be a checkpoint."""
        return max(self.max_model_bytes, self.max_checkpoint_bytes)
