"""What a caller hands the pipeline (`ExportRequest`, the callbacks) and gets back
(`ExportResult`): the pipeline's modules (`pipeline`, `export_run`, `pipeline_steps`,
`encoder_program`) depend on these types, and nothing here on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.load.model import Upload
from schemas import ExportOptions, Progress, ReportDocument, RoundtripCheck

__all__ = [
    "ExportRequest",
    "ExportResult",
    "ProgressCallback",
    "ReportHook",
    "RoundtripDrop",
    "RoundtripPrefetch",
    "RoundtripRunner",
]

ProgressCallback = Callable[[Progress], None]
RoundtripRunner = Callable[[Path, Path], RoundtripCheck]
RoundtripPrefetch = Callable[[Path], None]
RoundtripDrop = Callable[[], None]
ReportHook = Callable[[ReportDocument], None]


@dataclass(frozen=True)
class ExportRequest:
    """What to export and where: artifacts go to `out_dir`, scratch files to `work_dir`."""

    upload: Upload
    options: ExportOptions
    out_dir: Path
    work_dir: Path
    digest_artifacts: bool = True
    """List the artifacts, with their SHA-256, in the report. The sandbox's job child
    says no: the worker hashes the files it accepts from the child and lists them
    itself (reading a big program twice is 3 ms for a transformer block's 3.4 MB)."""
    time_limit_s: float | None = None
    """The job's wall-clock limit as whoever runs it enforces it (a worker caps
    `timeout_s`); None: `options.timeout_s`. The targets' budgets share what it leaves."""
    provisional_report: bool = False
    """Before each target and before profiling, write `report.partial.json`: the report as
    it would be were the job stopped there by its time limit (the sandbox's worker then
    delivers it, the program and the finished targets instead of nothing). Removed once
    `report.json` is written."""


@dataclass
class ExportResult:
    """The report (always) and the artifacts written, by name."""

    report: ReportDocument
    artifacts: dict[str, Path] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        """Whether the export produced a verified program."""
        return self.report.status == "succeeded"
