"""Jobs as the REST API shows them (docs/contract.md §7)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas._base import StrictModel
from schemas.errors import ErrorBody, Stage
from schemas.options import ExportOptions

JobStatus = Literal["queued", "running", "succeeded", "failed", "canceled"]
TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "canceled")


class StageEvent(StrictModel):
    """A stage change of a job, as stored and as streamed."""

    stage: Stage | None = None
    status: JobStatus | Literal["started", "progress", "finished"]
    at: datetime
    fraction: float | None = None
    message: str | None = None


class ArtifactRef(StrictModel):
    """A downloadable artifact of a job."""

    name: str
    size: int
    sha256: str
    media_type: str


class WebhookDelivery(StrictModel):
    """How the completion callback (`options.callback_url`) went."""

    status: Literal["pending", "delivered", "failed"]
    attempts: int = 0
    last_status_code: int | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None


class JobPublic(StrictModel):
    """A job as the API returns it."""

    id: str
    status: JobStatus
    stage: Stage | None = None
    stages: list[StageEvent] = Field(default_factory=list)
    options: ExportOptions
    error: ErrorBody | None = None
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    cache_hit: bool = False
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = Field(
        default=0, description="How many times a worker started this job (re-queued once if lost)."
    )
    webhook: WebhookDelivery | None = None
    model_name: str | None = Field(
        default=None,
        description="The uploaded model file's base name, reduced to `[A-Za-z0-9._-]` "
        "(`GET /v1/exports/{id}/uploads/model` serves it); null when not recorded.",
    )
    inputs_name: str | None = Field(
        default=None, description="The uploaded inputs file's name; null when none was uploaded."
    )
    weights_name: str | None = Field(
        default=None, description="The uploaded weights file's name; null when none was uploaded."
    )
