"""Time budgets of the deployment targets through the sandbox: a target over its budget
fails alone (`target_failed`, `reason` `timeout`) and the job keeps its verified program;
a job the worker must stop for its own time limit while a target runs is delivered as its
provisional report says: the program and what finished, the running target failed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.serialize.artifacts import CRASH_REPORT, PROVISIONAL_REPORT
from schemas import SandboxReport
from tests.sandbox.conftest import fresh_runner, run_upload
from worker.sandbox import SandboxResult, SandboxRunner

pytest.importorskip("onnxruntime", reason="the `targets` extra is not installed")

QUICK = {"verify": {"samples": 0}, "profile": {"enabled": False}}


@pytest.fixture(scope="module")
def runner() -> Iterator[SandboxRunner]:
    root = Path(tempfile.mkdtemp(prefix="torchport-budgets-"))
    os.chmod(root, 0o755)
    with fresh_runner(work_root=root / "work", spares=False) as started:
        yield started
    shutil.rmtree(root, ignore_errors=True)


def _timed_out_target(result: SandboxResult, limit: str) -> dict[str, object]:
    """The job succeeded with its program, and target onnx failed by `limit`."""
    assert result.error is None, result.error
    report = result.report
    assert report.status == "succeeded"
    assert {"program.pt2", "graph.json", "signature.json"} <= set(result.artifacts)
    assert "model.onnx" not in result.artifacts
    assert PROVISIONAL_REPORT not in result.artifacts
    assert [a.name for a in report.artifacts if a.name == "program.pt2"] == ["program.pt2"]
    onnx = report.targets["onnx"]
    assert onnx.status == "failed" and onnx.error is not None
    assert onnx.error.code == "target_failed"
    details = onnx.error.details
    assert (details["target"], details["reason"], details["limit"]) == ("onnx", "timeout", limit)
    warned = [w for w in report.warnings if w.code == "target_failed"]
    assert [w.details["reason"] for w in warned] == ["timeout"]
    return details


def test_a_target_over_its_budget_fails_and_the_job_keeps_its_program(
    runner: SandboxRunner,
) -> None:
    result = run_upload(
        runner, "target_slow.py", {"targets": ["onnx"], "target_timeout_s": 1, **QUICK}
    )
    details = _timed_out_target(result, "target_timeout_s")
    assert details["budget_s"] == 1
    assert details["phase"] in ("converting", "loading", "verifying")
    assert result.report.verification is not None and result.report.verification.passed


@pytest.mark.slow
def test_a_job_stopped_by_its_time_limit_while_converting_keeps_what_it_finished(
    runner: SandboxRunner,
) -> None:
    # The target swallows its budget's exception: only the worker's kill stops it.
    result = run_upload(
        runner, "target_stubborn.py", {"targets": ["onnx"], "timeout_s": 40, **QUICK}
    )
    details = _timed_out_target(result, "timeout_s")
    assert details["timeout_s"] == 40
    report = result.report
    assert isinstance(report.sandbox, SandboxReport)
    assert report.sandbox.details["exit"]["signal"] is not None  # it was killed
    stopped = report.stages[-1]
    assert (stopped.name, stopped.status) == ("converting", "failed")
    assert report.verification is not None and report.verification.passed


def test_a_job_whose_process_crashes_while_converting_keeps_its_program(
    runner: SandboxRunner,
) -> None:
    # The process aborts (SIGABRT) inside target onnx's verification: the job is what
    # its crash report says, the program verified and delivered, the target failed
    result = run_upload(runner, "target_crash.py", {"targets": ["onnx", "aoti"], **QUICK})
    assert result.error is None, result.error
    report = result.report
    assert report.status == "succeeded"
    assert {"program.pt2", "graph.json", "signature.json"} <= set(result.artifacts)
    assert "model.onnx" not in result.artifacts
    assert not {PROVISIONAL_REPORT, CRASH_REPORT} & set(result.artifacts)
    assert report.verification is not None and report.verification.passed
    onnx = report.targets["onnx"]
    assert onnx.status == "failed" and onnx.error is not None
    assert (onnx.error.code, onnx.error.details["reason"], onnx.error.details["signal"]) == (
        "target_failed",
        "crashed",
        "SIGABRT",
    )
    assert report.targets["aoti"].status == "skipped"  # never reached
    warned = [w.details for w in report.warnings if w.code == "target_failed"]
    assert [(w["target"], w["reason"], w["signal"]) for w in warned] == [
        ("onnx", "crashed", "SIGABRT")
    ]
    stopped = report.stages[-1]
    assert (stopped.name, stopped.status) == ("converting", "failed")
    assert isinstance(report.sandbox, SandboxReport)
    assert report.sandbox.details["exit"]["signal"] is not None
