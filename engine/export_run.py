"""The bookkeeping of one export, and the torch warnings it reports.

`ExportRun` holds what `engine.pipeline.run_export` gathers while the stages run: stage
timings and memory peaks (`step`, `engine.resident_memory`), progress callbacks, the
report's sections, its warnings, the libraries the upload imported and the deployment
targets converted. `torch_warnings` turns the warnings caught during the export into the
report's `torch_warning` entries.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from engine import resident_memory
from engine.source_map import SourceMap
from schemas import Progress, ReportWarning, StageRecord, TargetResult, TracingReport

if TYPE_CHECKING:
    from engine.export_request import ExportRequest, ProgressCallback

__all__ = ["MAX_TORCH_WARNINGS", "QUIET_CATEGORIES", "ExportRun", "torch_warnings"]


class ExportRun:
    """Bookkeeping of one export: stage timings, progress, the pieces of the report."""

    def __init__(self, request: ExportRequest, progress: ProgressCallback | None) -> None:
        self.request = request
        self.progress = progress
        self.stages: list[StageRecord] = []
        self.warnings: list[ReportWarning] = []
        self.sections: dict[str, Any] = {"tracing": TracingReport()}
        self.stage: str = "loading"
        self.source_map = SourceMap(request.work_dir / "src")
        self.libraries: dict[str, str] = {}
        """What the upload imported, for the report's environment (filled by loading)."""
        self.targets: dict[str, TargetResult] = {}
        """Each deployment target converted so far (option `targets`)."""

    def emit(self, fraction: float, message: str = "") -> None:
        if self.progress is not None:
            self.progress(Progress(stage=self.stage, fraction=fraction, message=message))

    @contextmanager
    def step(self, name: str, message: str) -> Iterator[None]:
        self.stage = name
        self.emit(0.0, message)
        started = time.perf_counter()
        memory = resident_memory.PeakWatch().start()
        try:
            yield
        except BaseException:
            self.stages.append(
                StageRecord(
                    name=name,
                    status="failed",
                    duration_s=time.perf_counter() - started,
                    peak_rss_mb=memory.stop()[0],
                )
            )
            raise
        self.stages.append(
            StageRecord(
                name=name,
                status="succeeded",
                duration_s=time.perf_counter() - started,
                peak_rss_mb=memory.stop()[0],
            )
        )
        self.emit(1.0, f"{name} done")


QUIET_CATEGORIES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning, ResourceWarning)
"""Deprecation notices from torch's internals, and ResourceWarnings (an unclosed file or
socket anywhere in the process, reported whenever the garbage collector happens to run
during the export): nothing a user can act on. The user's own warnings are always
reported, whatever their category."""

MAX_TORCH_WARNINGS = 20


def torch_warnings(
    caught: list[warnings.WarningMessage], source_map: SourceMap
) -> list[ReportWarning]:
    """Warnings raised while exporting, once each, with the user's file when it was theirs."""
    seen: dict[str, ReportWarning] = {}
    for item in caught:
        text = source_map.scrub(str(item.message)).strip()
        if not text or text in seen or len(seen) >= MAX_TORCH_WARNINGS:
            continue
        location = source_map.location(item.filename, item.lineno)
        if location is None and issubclass(item.category, QUIET_CATEGORIES):
            continue
        details: dict[str, Any] = {"category": item.category.__name__}
        if location is not None:
            details["location"] = location.model_dump()
        seen[text] = ReportWarning(code="torch_warning", message=text, details=details)
    return list(seen.values())
