"""The one catalogue of outcomes: for each stable error code, the HTTP status of an API
answer with it, the stage it belongs to, its message and its hint.

Every layer builds its error bodies from here — the engine's typed errors, the sandbox's
verdicts on a job's exit (time, memory, disk, signals, cancel), the worker's and the
API's — so a code's hint is written once, and a code's status is the one the contract's
table gives (docs/contract.md §5, checked by tests/test_contract_doc.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import ERROR_CODES, ErrorBody, ErrorCode, SourceLocation

__all__ = [
    "CATALOGUE",
    "Outcome",
    "canceled",
    "error_body",
    "invalid_request",
    "outcome",
    "validation_items",
]


@dataclass(frozen=True)
class Outcome:
    """What one code means."""

    code: ErrorCode
    http_status: int | None
    """The status of an API answer with this code; None for codes that only end a job."""
    message: str
    """The default message; `{name}` fields are filled from `error_body`'s values."""
    hint: str | None = None
    ends_jobs: bool = True
    """Whether a job can end with it (the contract's *job* codes)."""


_BUG = "This is a bug in torchport, not in your model; please report it."
_SANDBOX = "Uploaded code may not use the network, start processes or leave its directory."
_MEMORY = "Raise `memory_mb`, or use smaller example inputs."
_TIME = "Raise `timeout_s`, or export a smaller configuration of the model."
_DISK = (
    "Write less to disk from the model (temporary files, caches, extra checkpoints); the "
    "limits are the worker's TORCHPORT_SANDBOX_DISK_MB, TORCHPORT_SANDBOX_MAX_INODES and "
    "TORCHPORT_SANDBOX_FSIZE_MB."
)

CATALOGUE: dict[str, Outcome] = {
    o.code: o
    for o in (
        Outcome("invalid_request", 400, "The request is invalid."),
        Outcome("upload_too_large", 413, "A file is larger than this server accepts.", None, False),
        Outcome(
            "environment_mismatch",
            None,
            "The worker does not meet the upload's requirements.",
            "Install the required versions in the worker image (see `torchport env` or "
            "GET /v1/environment for what is installed), or relax the specifiers in `requires`.",
        ),
        Outcome(
            "model_import_failed",
            None,
            "Importing the uploaded module failed.",
            "Fix the error in the uploaded module at `location`.",
        ),
        Outcome(
            "model_not_found",
            None,
            "The upload defines nothing to export.",
            "Define `model` (an nn.Module instance or class, or a function of tensors) or "
            "`get_model()` at module level, or name another symbol in the options.",
        ),
        Outcome("invalid_inputs", None, "The example inputs cannot be used."),
        Outcome(
            "weights_mismatch",
            None,
            "The weights do not match the model.",
            "Upload the state dict saved from this exact model class.",
        ),
        Outcome(
            "eager_run_failed",
            None,
            "The model raised when run on its example inputs.",
            "The model fails on its example inputs before any export: fix it or the inputs.",
        ),
        Outcome("unsupported_python", None, "Tracing met a Python feature export cannot record."),
        Outcome("data_dependent", None, "Control flow or shapes depend on tensor values."),
        Outcome(
            "dynamic_shape_violation", None, "The dynamic shapes conflict with the model's code."
        ),
        Outcome(
            "missing_fake_kernel",
            None,
            "A custom operator has no fake kernel.",
            "Register a fake (meta) kernel for the custom operator with "
            '`@torch.library.register_fake("ns::op")`, computing output shapes without data.',
        ),
        Outcome("decomposition_failed", None, "Decomposing the program failed."),
        Outcome("verification_failed", None, "The exported program does not match eager."),
        Outcome("serialization_failed", None, "Saving or loading the program failed."),
        Outcome(
            "non_portable_op",
            None,
            "The program calls operators a torch-only loader cannot resolve.",
            "The operators are registered by a library (or the upload) at import, so "
            "`torch.export.load` fails wherever that library is not imported. Write the "
            "computation with torch operations, or give the operator a decomposition to ATen "
            "(a CompositeImplicitAutograd kernel) so that decomposition removes it.",
        ),
        Outcome(
            "target_failed",
            None,
            "Converting the program to a deployment target failed.",
            "The program.pt2 is unaffected. See `report.targets` for the converter's error; "
            "leave `targets_required` false to keep the job when a target fails.",
        ),
        Outcome(
            "quantization_inaccurate",
            None,
            "A quantized target is outside the accuracy budget against the float model.",
            "See `report.quantization` for each output's cosine and abs error; loosen "
            "`quantize.min_cosine` or `quantize.max_abs`, try a milder scheme "
            "(`int8_dynamic`, `int8_weight_only`), or leave `targets_required` false to keep "
            "the job.",
        ),
        Outcome(
            "timeout",
            None,
            "The job ran longer than its time limit of {timeout_s:g} s and was stopped.",
            _TIME,
        ),
        Outcome(
            "out_of_memory",
            None,
            "The job used more than its memory limit of {memory_mb} MB and was stopped.",
            _MEMORY,
        ),
        Outcome(
            "disk_quota_exceeded",
            None,
            "The job wrote more than its disk limit of {disk_mb} MB or {max_inodes} files "
            "and was stopped.",
            _DISK,
        ),
        Outcome(
            "sandbox_violation",
            None,
            "The uploaded code tried an action the sandbox forbids.",
            _SANDBOX,
        ),
        Outcome("canceled", None, "canceled by the user"),
        Outcome("unauthorized", 401, "A valid API key is required.", None, False),
        Outcome("forbidden", 403, "This key may not do this.", None, False),
        Outcome("not_found", 404, "Not found.", None, False),
        Outcome("rate_limited", 429, "Too many requests.", "Wait and retry.", False),
        Outcome("internal_error", 500, "Something went wrong inside torchport.", _BUG),
        Outcome("conflict", 409, "The job's state does not allow this.", None, False),
        Outcome(
            "expired",
            410,
            "The job's files have expired and were deleted.",
            "Submit the job again: a server keeps a finished job's uploads and artifacts "
            "for TORCHPORT_RETENTION_HOURS.",
            False,
        ),
        Outcome(
            "storage_quota_exceeded",
            413,
            "This key holds more in the store than its quota allows.",
            "Wait until older jobs expire (their uploads and artifacts are kept for "
            "TORCHPORT_RETENTION_HOURS), or ask the operator for a larger "
            "TORCHPORT_STORAGE_QUOTA_BYTES.",
            False,
        ),
    )
}
"""Code → outcome; every `ErrorCode` has exactly one entry."""

assert set(CATALOGUE) == set(ERROR_CODES), set(ERROR_CODES) ^ set(CATALOGUE)


def outcome(code: str) -> Outcome:
    """The catalogue entry of `code`.

    Raises:
        KeyError: not a code of the contract.
    """
    return CATALOGUE[code]


def error_body(
    code: ErrorCode,
    message: str | None = None,
    *,
    hint: str | None = None,
    stage: str | None = None,
    location: SourceLocation | None = None,
    details: Mapping[str, Any] | None = None,
    **values: Any,
) -> ErrorBody:
    """An error body of `code`: `message` or the catalogue's, filled from `values`; `hint`
    or the catalogue's."""
    entry = CATALOGUE[code]
    return ErrorBody.model_validate(
        {
            "code": code,
            "message": message if message is not None else entry.message.format(**values),
            "hint": hint if hint is not None else entry.hint,
            "stage": stage,
            "location": location,
            "details": dict(details or {}),
        }
    )


def canceled() -> ErrorBody:
    """The body of a job canceled by its owner."""
    return error_body("canceled")


def validation_items(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic validation errors (`exc.errors()`) as JSON-safe `{field, type, message}`
    items, the contract's `details.errors[]`."""
    items = []
    for err in errors:
        loc = [str(part) for part in err.get("loc", ()) if part not in ("body",)]
        items.append({"field": ".".join(loc), "type": err.get("type"), "message": err.get("msg")})
    return items


def invalid_request(message: str, errors: Iterable[Mapping[str, Any]]) -> ErrorBody:
    """`invalid_request` for pydantic validation errors (`exc.errors()`)."""
    return error_body("invalid_request", message, details={"errors": validation_items(errors)})
