"""Turns torch's exceptions into torchport errors: the one place that does.

`classify(exc, stage=, source_map=)` returns an `ExportError` carrying a contract code, a
message a person understands (torch's boilerplate stripped, server paths scrubbed), a
concrete hint, the innermost location in the user's code, machine-readable `details` and
the matching ExportDB cases.

Rules, first match wins (the exception's whole `__cause__`/`__context__` chain is read,
because dynamo and export wrap the original error, sometimes more than once):

1. An `ExportError` passes through unchanged.
2. Stage `decomposing` → `decomposition_failed`; stage `serializing` →
   `serialization_failed`; stage `verifying` → `verification_failed` when the exported
   program itself raised (its fx code is on the stack; otherwise the rules below
   apply). What the rules below would have said, unless an internal error, goes into
   `details["cause_code"]`.
3. `data_dependent`: `GuardOnDataDependentSymNode`, `DataDependentOutputException`,
   text "Could not guard on / extract specialized integer from data-dependent
   expression", dynamo's "Data-dependent branching" graph break, `UserError`
   `DYNAMIC_CONTROL_FLOW`, and `DynamicOutputShapeException` of an ATen operator.
   Checked before constraint violations: dynamo re-raises a data-dependent guard as a
   `CONSTRAINT_VIOLATION` UserError.
4. `missing_fake_kernel`: `UnsupportedOperatorException` (a custom op with no
   fake/meta kernel), "no fake impl registered", "Could not run … 'Meta' backend",
   "has no meta", `DynamicOutputShapeException` of a non-ATen operator, and dynamo's
   "Operator does not support running with fake tensors".
5. `dynamic_shape_violation`: `ConstraintViolationError`, `ValueRangeError`, `UserError`
   `CONSTRAINT_VIOLATION` / `DYNAMIC_DIM`, and `INVALID_INPUT` errors about the
   dynamic-shapes spec itself (ExportDB case `dynamic_shapes_validation`).
6. `invalid_inputs`: any other `UserError` `INVALID_INPUT` (export rejects an input).
7. `unsupported_python`: dynamo's `Unsupported` graph breaks, every other `UserError`
   (`ANTI_PATTERN`, `STANDARD_LIBRARY`, `INVALID_OUTPUT`, …), and `TorchRuntimeError`
   (an operation failed under fake tensors in strict mode).
8. Nothing matched: if the innermost frame of the traceback is user code, the user's code
   raised while being traced (it behaves differently under fake tensors: a type check, a
   data pointer, numpy) → `unsupported_python` with `details["raised_in_user_code"]`.
   If the innermost frame is torch's but the stack passes through user code and the
   exception is not one of torch's internal-assertion types, torch refused something the
   user's line asked for (e.g. `.numpy()` of a fake tensor) → `unsupported_python` as well.
9. Anything else (no user frame, or an internal assertion of torch or of ours) →
   `internal_error`, whose message says it is a bug of torchport.

The location is the innermost user frame from, in order: dynamo's `real_stack` (strict
mode traces symbolically, so the Python traceback never enters user code), the Python
traceback chain (non-strict), and `File "…", line N` in the text.

The rules live in `engine.diagnostics.rules`, the reading of exceptions (cause chain, text,
location) in `engine.diagnostics.exception_text`; `essential`, `locate` and the message helpers are
re-exported here.
"""

from __future__ import annotations

import errno
import traceback
from typing import Any

from engine.diagnostics.exception_text import (
    branch_condition,
    essential,
    exc_type_name,
    exception_chain,
    first_line,
    locate,
    python_expression,
    readable_sources,
)
from engine.diagnostics.rules import classify_cause
from engine.diagnostics.source_map import SourceMap
from engine.errors import (
    DecompositionFailed,
    DiskQuotaExceeded,
    ExportError,
    InternalError,
    OutOfMemory,
    SerializationFailed,
    VerificationFailed,
)

__all__ = [
    "branch_condition",
    "classify",
    "essential",
    "limit_reached",
    "locate",
    "python_expression",
    "readable_sources",
]


def classify(exc: BaseException, *, stage: str, source_map: SourceMap) -> ExportError:
    """Map any exception raised while exporting to an `ExportError` with a contract code.

    Args:
        exc: what the stage raised.
        stage: the contract stage it was raised in (`tracing`, `decomposing`, …).
        source_map: where the upload lives, to find and name locations in user code.

    Returns:
        The error to report; `exc` itself when it already is an `ExportError`.
    """
    if isinstance(exc, ExportError):
        return exc
    chain = list(exception_chain(exc))
    location = locate(exc, source_map)
    cause = classify_cause(chain, exc, stage, location, source_map)
    wrapper = _STAGE_ERRORS.get(stage)
    if wrapper is None or (stage == "verifying" and not _ran_program(exc)):
        return cause
    error_type, what, hint = wrapper
    details: dict[str, Any] = {"exception_type": exc_type_name(exc)}
    if not isinstance(cause, InternalError):  # what tracing would call it, when it knows
        details["cause_code"] = cause.code
        details.update({k: v for k, v in cause.details.items() if k != "exception_type"})
    return error_type(
        f"{what} failed: {exc_type_name(exc)}: {first_line(exc, source_map)}",
        hint=hint,
        stage=stage,
        location=location,
        details=details,
        exportdb=cause.exportdb,
    )


def limit_reached(error: ExportError) -> ExportError | None:
    """The job's own limit when one was what failed `error`, whatever the stage and
    whatever code the stage gave it: memory (a `MemoryError`, torch's
    `OutOfMemoryError`, ENOMEM) or the largest file it may write (EFBIG, RLIMIT_FSIZE).
    The stage's code and message are kept in `details`. None when no limit was hit."""
    for link in exception_chain(error):
        if isinstance(link, MemoryError) or _errno(link) == errno.ENOMEM or _torch_oom(link):
            return OutOfMemory(
                "The job ran out of memory (over its memory_mb limit).",
                stage=error.stage,
                details={"original_code": error.code},
            )
        if _errno(link) == errno.EFBIG:
            return DiskQuotaExceeded(
                "The job wrote a file larger than the sandbox allows.",
                stage=error.stage,
                location=error.location,
                details={"original_code": error.code, "original_message": error.message},
            )
    return None


def _errno(exc: BaseException) -> int | None:
    return exc.errno if isinstance(exc, OSError) else None


def _torch_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


_STAGE_ERRORS: dict[str, tuple[type[ExportError], str, str]] = {
    "decomposing": (
        DecompositionFailed,
        "Decomposing the program (run_decompositions)",
        "Keep the failing operator whole with `decomposition.preserve`, or export without "
        'decomposition (`decomposition.mode: "none"`).',
    ),
    "serializing": (
        SerializationFailed,
        "Saving the exported program",
        "When the message names a custom object, an opaque type or a constant, keep it out "
        'of forward() or turn it into a tensor; export with `decomposition.mode: "none"` '
        "to see whether a decomposed operator is the cause.",
    ),
    "verifying": (
        VerificationFailed,
        "Running the exported program",
        "The exported program raised where eager did not: check the runtime assertions "
        "(`torch._check`) and the dynamic ranges against the sample inputs.",
    ),
}


def _ran_program(exc: BaseException) -> bool:
    """Whether the exception came out of running an exported program (fx generated code)."""
    return any(
        frame.filename.startswith("<eval_with_key>")
        for link in exception_chain(exc)
        for frame in traceback.extract_tb(link.__traceback__)
    )
