"""A job the worker stopped for its time limit (results.finish with `timed_out`) or its memory
limit, or whose process crashed, after it saved its program: what its
provisional report lists is delivered, checked as untrusted data like `report.json`;
without one, or with one the checks refuse, the job timed out with nothing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from engine.serialize.artifacts import CRASH_REPORT, PROVISIONAL_REPORT
from schemas import ErrorBody, ExportOptions, Progress, ReportDocument
from schemas.outcomes import error_body
from tests.sandbox.conftest import MODELS
from worker.sandbox import SandboxJob, SandboxSettings
from worker.sandbox.host import results

pytest.importorskip("onnxruntime", reason="the `targets` extra is not installed")

TIMEOUT = error_body("timeout", timeout_s=60, details={"timeout_s": 60})
OUT_OF_MEMORY = error_body("out_of_memory", memory_mb=1024, details={"memory_mb": 1024})


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job child's out dir as it was while target onnx loaded its model.onnx: the
    program, its documents, the provisional report, an unverified model.onnx."""
    root = tmp_path_factory.mktemp("stopped")
    snapshot = root / "snapshot"

    def progress(p: Progress) -> None:
        if p.message == "onnx: loading":
            shutil.copytree(root / "out", snapshot)

    run_export(
        ExportRequest(
            upload=Upload(model=MODELS / "service_small.py"),
            options=ExportOptions.model_validate(
                {
                    "targets": ["onnx"],
                    "verify": {"samples": 0, "roundtrip": False},
                    "profile": {"enabled": False},
                }
            ),
            out_dir=root / "out",
            work_dir=root / "work",
            digest_artifacts=False,
            provisional_report=True,
            time_limit_s=60,
        ),
        progress=progress,
    )
    written = {p.name for p in snapshot.iterdir()}
    assert {"program.pt2", "model.onnx", PROVISIONAL_REPORT, CRASH_REPORT} <= written
    return snapshot


CRASH = {
    "code": "internal_error",
    "message": "The job's process crashed (SIGSEGV).",
    "details": {"reason": "crashed", "signal": "SIGSEGV"},
}


def _finish(
    produced: Path, tmp_path: Path, *, timed_out: bool = True, crashed: bool = False
) -> results.SandboxResult:
    job = SandboxJob(
        model=MODELS / "service_small.py",
        inputs=None,
        weights=None,
        options=ExportOptions(),
        job_dir=tmp_path / "job",
    )
    error = TIMEOUT if timed_out else OUT_OF_MEMORY
    if crashed:
        error = ErrorBody.model_validate(CRASH)
    return results.finish(
        job,
        produced,
        error,
        "",
        time.perf_counter() - 60,  # the worker started it a minute ago
        {},
        SandboxSettings(),
        bwrap=False,
        timed_out=timed_out,
    )


def test_the_program_and_what_finished_are_delivered(stopped: Path, tmp_path: Path) -> None:
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    result = _finish(produced, tmp_path)
    assert result.error is None
    report = result.report
    assert report.status == "succeeded"
    assert set(result.artifacts) == {"program.pt2", "graph.json", "signature.json", "report.json"}
    assert sorted(a.name for a in report.artifacts) == [
        "graph.json",
        "program.pt2",
        "signature.json",
    ]
    onnx = report.targets["onnx"]
    assert onnx.status == "failed" and onnx.error is not None
    assert (onnx.error.code, onnx.error.details["reason"], onnx.error.details["limit"]) == (
        "target_failed",
        "timeout",
        "timeout_s",
    )
    # The stopped stage lasted until the worker stopped the job.
    assert (report.stages[-1].name, report.stages[-1].status) == ("converting", "failed")
    written = ReportDocument.model_validate_json((stopped / PROVISIONAL_REPORT).read_text())
    assert report.duration_s >= 60 > written.duration_s
    added = report.duration_s - written.duration_s
    assert report.stages[-1].duration_s == pytest.approx(written.stages[-1].duration_s + added)


def test_without_a_provisional_report_the_job_timed_out(stopped: Path, tmp_path: Path) -> None:
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    (produced / PROVISIONAL_REPORT).unlink()
    result = _finish(produced, tmp_path)
    assert result.error is not None and result.error.code == "timeout"
    assert set(result.artifacts) == {"report.json"}


def test_a_provisional_report_the_checks_refuse_is_not_delivered(
    stopped: Path, tmp_path: Path
) -> None:
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    (produced / PROVISIONAL_REPORT).write_text('{"status": "succeeded", "forged": true}')
    result = _finish(produced, tmp_path)
    assert result.error is not None and result.error.code == "timeout"
    assert set(result.artifacts) == {"report.json"}


def test_a_job_stopped_at_its_memory_limit_keeps_its_program(stopped: Path, tmp_path: Path) -> None:
    """Killed for memory while converting: the program and what finished are delivered,
    the target in progress failed `out_of_memory` (its crash report, re-worded)."""
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    result = _finish(produced, tmp_path, timed_out=False)
    assert result.error is None
    report = result.report
    assert set(result.artifacts) == {"program.pt2", "graph.json", "signature.json", "report.json"}
    onnx = report.targets["onnx"]
    assert onnx.status == "failed" and onnx.error is not None
    assert onnx.error.details == {"target": "onnx", "reason": "out_of_memory", "memory_mb": 1024}
    assert "memory_mb" in (onnx.error.hint or "")
    warning = next(w for w in report.warnings if w.code == "target_failed")
    assert warning.details["reason"] == "out_of_memory"
    assert report.stages[-1].message == "stopped at the job's memory limit"


def test_a_job_stopped_at_its_memory_limit_before_converting_fails(
    stopped: Path, tmp_path: Path
) -> None:
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    (produced / CRASH_REPORT).unlink()
    result = _finish(produced, tmp_path, timed_out=False)
    assert result.error is not None and result.error.code == "out_of_memory"
    assert set(result.artifacts) == {"report.json"}


def test_a_crashed_job_is_what_its_crash_report_says(stopped: Path, tmp_path: Path) -> None:
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    result = _finish(produced, tmp_path, timed_out=False, crashed=True)
    assert result.error is None
    report = result.report
    assert report.status == "succeeded"
    assert set(result.artifacts) == {"program.pt2", "graph.json", "signature.json", "report.json"}
    onnx = report.targets["onnx"]
    assert onnx.status == "failed" and onnx.error is not None
    assert onnx.error.details == {"target": "onnx", "reason": "crashed", "signal": "SIGSEGV"}
    assert (report.stages[-1].name, report.stages[-1].status) == ("converting", "failed")


def test_a_crash_without_its_report_fails_with_the_signal(stopped: Path, tmp_path: Path) -> None:
    produced = Path(shutil.copytree(stopped, tmp_path / "out"))
    (produced / CRASH_REPORT).unlink()
    result = _finish(produced, tmp_path, timed_out=False, crashed=True)
    assert result.error is not None and result.error.code == "internal_error"
    assert result.error.details == {"reason": "crashed", "signal": "SIGSEGV"}
    assert set(result.artifacts) == {"report.json"}
