"""Typed errors of the engine, each carrying a stable code from the contract.

```
ExportError                      (code, message, hint, stage, location, details, exportdb)
├── InvalidRequest               invalid_request
├── ModelImportFailed            model_import_failed
├── ModelNotFound                model_not_found
├── InvalidInputs                invalid_inputs
├── WeightsMismatch              weights_mismatch
├── EagerRunFailed               eager_run_failed
├── UnsupportedPython            unsupported_python
├── DataDependent                data_dependent
├── DynamicShapeViolation        dynamic_shape_violation
├── MissingFakeKernel            missing_fake_kernel
├── DecompositionFailed          decomposition_failed
├── VerificationFailed           verification_failed
├── SerializationFailed          serialization_failed
├── Timeout / OutOfMemory / SandboxViolation / Canceled   (raised by the sandbox's parent)
└── InternalError                internal_error — a bug of ours
```
torch's own exceptions are turned into these in exactly one place, `engine.diagnostics`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas import ErrorBody, SourceLocation


class ExportError(Exception):
    """An export failure a person can act on."""

    code: ClassVar[str] = "internal_error"
    default_hint: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        stage: str | None = None,
        location: SourceLocation | None = None,
        details: dict[str, Any] | None = None,
        exportdb: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.stage = stage
        self.location = location
        self.details = details or {}
        self.exportdb = exportdb or []

    def to_body(self) -> ErrorBody:
        """The contract's error body."""
        return ErrorBody.model_validate(
            {
                "code": self.code,
                "message": self.message,
                "hint": self.hint,
                "stage": self.stage,
                "location": self.location,
                "details": self.details,
                "exportdb": self.exportdb,
            }
        )

    def __str__(self) -> str:
        where = f" ({self.location.file}:{self.location.line})" if self.location else ""
        return f"[{self.code}] {self.message}{where}"


class InvalidRequest(ExportError):
    code = "invalid_request"


class ModelImportFailed(ExportError):
    code = "model_import_failed"
    default_hint = "Fix the error in the uploaded module, or install the package it imports."


class ModelNotFound(ExportError):
    code = "model_not_found"
    default_hint = (
        "Define `model` (an nn.Module instance or class, or a function of tensors) or "
        "`get_model()` at module level, or name another symbol in the options."
    )


class InvalidInputs(ExportError):
    code = "invalid_inputs"


class WeightsMismatch(ExportError):
    code = "weights_mismatch"
    default_hint = "Upload the state dict saved from this exact model class."


class EagerRunFailed(ExportError):
    code = "eager_run_failed"
    default_hint = "The model fails on its example inputs before any export: fix it or the inputs."


class UnsupportedPython(ExportError):
    code = "unsupported_python"


class DataDependent(ExportError):
    code = "data_dependent"


class DynamicShapeViolation(ExportError):
    code = "dynamic_shape_violation"


class MissingFakeKernel(ExportError):
    code = "missing_fake_kernel"
    default_hint = (
        "Register a fake (meta) kernel for the custom operator with "
        '`@torch.library.register_fake("ns::op")`, computing output shapes without data.'
    )


class DecompositionFailed(ExportError):
    code = "decomposition_failed"


class VerificationFailed(ExportError):
    code = "verification_failed"


class SerializationFailed(ExportError):
    code = "serialization_failed"


class Timeout(ExportError):
    code = "timeout"
    default_hint = "Raise `timeout_s`, or export a smaller configuration of the model."


class OutOfMemory(ExportError):
    code = "out_of_memory"
    default_hint = "Raise `memory_mb`, or use smaller example inputs."


class SandboxViolation(ExportError):
    code = "sandbox_violation"
    default_hint = "Uploaded code may not use the network, start processes or leave its directory."


class Canceled(ExportError):
    code = "canceled"


class InternalError(ExportError):
    code = "internal_error"
    default_hint = "This is a bug in torchport, not in your model; please report it."


ERROR_TYPES: dict[str, type[ExportError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        ModelImportFailed,
        ModelNotFound,
        InvalidInputs,
        WeightsMismatch,
        EagerRunFailed,
        UnsupportedPython,
        DataDependent,
        DynamicShapeViolation,
        MissingFakeKernel,
        DecompositionFailed,
        VerificationFailed,
        SerializationFailed,
        Timeout,
        OutOfMemory,
        SandboxViolation,
        Canceled,
        InternalError,
    )
}
"""Code → error class, for rebuilding an error from its body."""
