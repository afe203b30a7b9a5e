"""Turns torch's exceptions into torch-port errors (the one place that does).

PLACEHOLDER until the diagnostics work lands: everything is an internal error.
"""

from __future__ import annotations

from engine.errors import ExportError, InternalError
from engine.source_map import SourceMap


def classify(exc: BaseException, *, stage: str, source_map: SourceMap) -> ExportError:
    """Map any exception raised while exporting to an `ExportError` with a contract code."""
    if isinstance(exc, ExportError):
        return exc
    return InternalError(f"{type(exc).__name__}: {exc}", stage=stage)
