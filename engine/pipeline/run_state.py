"""The bookkeeping of one export, and the torch warnings it reports.

`ExportRun` holds what `engine.pipeline.export.run_export` gathers while the stages run: stage
timings and memory peaks (`step`, `engine.profile.resident_memory`), progress callbacks, the
report's sections, its warnings, the libraries the upload imported and the deployment
targets converted. `torch_warnings` turns the warnings caught during the export into the
report's `torch_warning` entries.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.diagnostics.source_map import SourceMap
from engine.environment import machine as environment
from engine.profile import resident_memory
from engine.serialize.artifacts import artifact_info
from schemas import (
    ErrorBody,
    Progress,
    ReportDocument,
    ReportWarning,
    StageRecord,
    TargetResult,
    TracingReport,
)

if TYPE_CHECKING:
    from engine.pipeline.request import ExportRequest, ProgressCallback

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
        self.started = time.perf_counter()
        self.stage_started = self.started

    @property
    def time_limit_s(self) -> float:
        """The job's wall-clock limit (`ExportRequest.time_limit_s`, else `timeout_s`)."""
        limit = self.request.time_limit_s
        return float(self.request.options.timeout_s if limit is None else limit)

    def time_left(self) -> float:
        """Seconds left of the job's time limit."""
        return self.time_limit_s - (time.perf_counter() - self.started)

    def report(
        self,
        error: ErrorBody | None,
        artifacts: dict[str, Path],
        *,
        stages: list[StageRecord] | None = None,
        warnings: list[ReportWarning] | None = None,
        targets: dict[str, TargetResult] | None = None,
    ) -> ReportDocument:
        """The report of what the run gathered (`stages`, `warnings`, `targets`: others
        than the run's own, for a provisional report)."""
        return ReportDocument(
            status="failed" if error else "succeeded",
            stages=self.stages if stages is None else stages,
            tracing=self.sections["tracing"],
            decomposition=self.sections.get("decomposition"),
            verification=self.sections.get("verification"),
            model=self.sections.get("model"),
            inputs=self.sections.get("inputs", []),
            weights=self.sections.get("weights"),
            warnings=self.warnings if warnings is None else warnings,
            error=error,
            draft_export=self.sections.get("draft_export"),
            targets=self.targets if targets is None else targets,
            checkpoint=self.sections.get("checkpoint"),
            generation=self.sections.get("generation"),
            profile=self.sections.get("profile"),
            quantization=self.sections.get("quantization"),
            environment=environment.describe(self.request.options.device, libraries=self.libraries),
            artifacts=(
                [artifact_info(path) for path in artifacts.values()]
                if self.request.digest_artifacts
                else []
            ),
            duration_s=time.perf_counter() - self.started,
        )

    def emit(self, fraction: float, message: str = "") -> None:
        if self.progress is not None:
            self.progress(Progress(stage=self.stage, fraction=fraction, message=message))

    @contextmanager
    def step(self, name: str, message: str) -> Iterator[None]:
        self.stage = name
        self.stage_started = time.perf_counter()
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
