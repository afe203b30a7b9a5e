"""Jobs: the job description every layer passes on (`JobSpec`), and jobs as the REST API
shows them (docs/contract.md §7).

A job changes shape once per trust boundary: the API validates the form into a `JobSpec`
(one `model_validate` of the whole description), the database keeps it, the worker reads
it back typed and hands its options to the sandbox as they are, and the job child
validates them again, since it trusts nothing it did not check.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from schemas._base import StrictModel
from schemas.errors import ErrorBody, ErrorCode, Stage
from schemas.options import CallbackUrl, ExportOptions, SubmittedOptions

JOB_SPEC_VERSION: Literal[1] = 1
"""Version of `JobSpec`: a new field gets a default; a description of another version does
not validate (`job-spec.schema.json`)."""

UPLOAD_ROLES = ("model", "inputs", "weights", "calibration")
"""The files of a job, in the order the form and the sandbox name them."""

JobStatus = Literal["queued", "running", "succeeded", "failed", "canceled"]
TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "canceled")


class UploadRef(StrictModel):
    """One uploaded file of a job: its (sanitized) name and its blob in the store."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int | None = Field(default=None, ge=0, description="Bytes; null when not recorded.")


class JobUploads(StrictModel):
    """The files of a job: the model, and optionally inputs, weights and the calibration
    inputs of `quantize.scheme: int8`."""

    model: UploadRef
    inputs: UploadRef | None = None
    weights: UploadRef | None = None
    calibration: UploadRef | None = None


class JobSpec(StrictModel):
    """One export job as the API accepted it and a worker runs it: what to export (the
    uploads, by content), how (`options`, all the engine sees) and who to tell when it
    ends (`callback_url`, the job's, never the engine's)."""

    version: Literal[1] = JOB_SPEC_VERSION
    uploads: JobUploads
    options: ExportOptions = Field(default_factory=ExportOptions)
    callback_url: CallbackUrl | None = None

    @model_validator(mode="before")
    @classmethod
    def _callback_out_of_options(cls, data: Any) -> Any:
        """`options.callback_url` (deprecated) is the job's `callback_url`; both given
        and different is refused."""
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
            return data
        options = dict(data["options"])
        if "callback_url" not in options:
            return data
        legacy = options.pop("callback_url")
        given = data.get("callback_url")
        if legacy is not None and given is not None and legacy != given:
            raise ValueError(
                "callback_url and options.callback_url differ: send only the callback_url field"
            )
        return {**data, "options": options, "callback_url": given if given is not None else legacy}


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
    """How the completion callback (`callback_url`) went."""

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
    options: SubmittedOptions
    callback_url: str | None = Field(
        default=None,
        description="Where the job body is POSTed when the job ends (the `callback_url` "
        "form field, or the deprecated `options.callback_url`); null for none.",
    )
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
    calibration_name: str | None = Field(
        default=None,
        description="The uploaded calibration file's name; null when none was uploaded.",
    )
    expired_at: datetime | None = Field(
        default=None,
        description="When the job's uploads and artifacts were deleted, its retention time "
        "having passed (their routes answer `expired`); null while they are kept.",
    )


class ErrorSummary(StrictModel):
    """What a job summary says of the job's error: its code (the whole error is in the job)."""

    code: ErrorCode


class JobSummary(StrictModel):
    """A job as the jobs list shows it (`GET /v1/exports`): a few hundred bytes whatever the
    job recorded. No stage events, options, artifacts or error text: the whole job is at
    `GET /v1/exports/{id}`."""

    id: str
    status: JobStatus
    stage: Stage | None = None
    error: ErrorSummary | None = Field(
        default=None, description="The code of the job's error; null when it has none."
    )
    cache_hit: bool = False
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    model_name: str | None = None
    inputs_name: str | None = None
    weights_name: str | None = None
    calibration_name: str | None = None
    expired_at: datetime | None = Field(
        default=None, description="When the job's files were deleted; null while kept."
    )
    targets: list[str] = Field(
        default_factory=list,
        description="The deployment targets the job's options ask for (`targets`).",
    )


class JobList(StrictModel):
    """One page of job summaries, newest first (the whole job: `GET /v1/exports/{id}`)."""

    items: list[JobSummary]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null on the last."
    )
