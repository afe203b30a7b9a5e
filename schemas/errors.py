"""The error body and the stable error codes of the contract (docs/contract.md §5)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from schemas._base import StrictModel

ErrorCode = Literal[
    "invalid_request",
    "upload_too_large",
    "model_import_failed",
    "model_not_found",
    "invalid_inputs",
    "weights_mismatch",
    "eager_run_failed",
    "unsupported_python",
    "data_dependent",
    "dynamic_shape_violation",
    "missing_fake_kernel",
    "decomposition_failed",
    "verification_failed",
    "serialization_failed",
    "timeout",
    "out_of_memory",
    "sandbox_violation",
    "canceled",
    "unauthorized",
    "forbidden",
    "not_found",
    "rate_limited",
    "internal_error",
    "conflict",
    "environment_mismatch",
    "disk_quota_exceeded",
    "target_failed",
    "expired",
    "storage_quota_exceeded",
    "non_portable_op",
    "quantization_inaccurate",
]
"""Stable codes: add, never rename."""

ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)

Stage = Literal[
    "loading", "tracing", "decomposing", "verifying", "serializing", "converting", "profiling"
]
"""The stages of a running export, in order."""

STAGES: tuple[str, ...] = get_args(Stage)


class SourceLocation(StrictModel):
    """A place in the user's uploaded code (never a server path)."""

    file: str = Field(description="Path as uploaded, e.g. `model.py` or `pkg/net.py`.")
    line: int
    code: str | None = Field(default=None, description="The source line, stripped.")


class ErrorBody(StrictModel):
    """The one error shape used by HTTP answers, job records, reports and the CLI."""

    code: ErrorCode
    message: str
    hint: str | None = None
    stage: Stage | None = None
    location: SourceLocation | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    exportdb: list[str] = Field(
        default_factory=list, description="Names of matching torch ExportDB cases."
    )
