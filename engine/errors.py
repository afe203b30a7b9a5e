"""Typed errors of the engine, each carrying a stable code from the contract.

```
ExportError                      (code, message, hint, stage, location, details, exportdb)
├── InvalidRequest               invalid_request
├── EnvironmentMismatch          environment_mismatch
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
├── NonPortableOp                non_portable_op
├── TargetFailed                 target_failed
├── QuantizationInaccurate       quantization_inaccurate
├── OutOfMemory                  out_of_memory        (a MemoryError in any stage)
├── DiskQuotaExceeded            disk_quota_exceeded  (a file over RLIMIT_FSIZE: EFBIG)
└── InternalError                internal_error — a bug of ours
```
torch's own exceptions are turned into these in exactly one place,
`engine.diagnostics.classification`.
Default hints come from the contract's catalogue (`schemas.outcomes`); the limits the
sandbox enforces from outside (time, memory, disk, cancel) are judged by the runner.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas import ErrorBody, SourceLocation
from schemas.outcomes import outcome


class ExportError(Exception):
    """An export failure a person can act on."""

    code: ClassVar[str] = "internal_error"

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
        self.hint = hint if hint is not None else outcome(self.code).hint
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


class EnvironmentMismatch(ExportError):
    code = "environment_mismatch"


class ModelImportFailed(ExportError):
    code = "model_import_failed"


class ModelNotFound(ExportError):
    code = "model_not_found"


class InvalidInputs(ExportError):
    code = "invalid_inputs"


class WeightsMismatch(ExportError):
    code = "weights_mismatch"


class EagerRunFailed(ExportError):
    code = "eager_run_failed"


class UnsupportedPython(ExportError):
    code = "unsupported_python"


class DataDependent(ExportError):
    code = "data_dependent"


class DynamicShapeViolation(ExportError):
    code = "dynamic_shape_violation"


class MissingFakeKernel(ExportError):
    code = "missing_fake_kernel"


class DecompositionFailed(ExportError):
    code = "decomposition_failed"


class VerificationFailed(ExportError):
    code = "verification_failed"


class SerializationFailed(ExportError):
    code = "serialization_failed"


class NonPortableOp(ExportError):
    """The program calls operators that only a process importing their library knows."""

    code = "non_portable_op"


class TargetFailed(ExportError):
    """A deployment target failed and the options made targets required."""

    code = "target_failed"


class QuantizationInaccurate(ExportError):
    """A quantized target is outside the accuracy budget and targets are required."""

    code = "quantization_inaccurate"


class OutOfMemory(ExportError):
    code = "out_of_memory"


class DiskQuotaExceeded(ExportError):
    code = "disk_quota_exceeded"


class InternalError(ExportError):
    code = "internal_error"
