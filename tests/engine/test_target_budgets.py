"""Time budgets of the deployment targets (engine.targets.time_budget,
engine.pipeline.target_stages): each target's share of the job's time, the limit that
stops one wherever it is, and the provisional report a sandboxed job writes before each
target and before profiling."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from engine.serialize.artifacts import PROVISIONAL_REPORT
from engine.targets import time_budget
from schemas import ExportOptions, Progress
from tests.engine.model_files import MODELS

pytest.importorskip("onnxruntime", reason="the `targets` extra is not installed")

QUICK = {"verify": {"samples": 0, "roundtrip": False}, "profile": {"enabled": False}}
"""No samples, no round trip in a fresh process, no profiles: the targets are the test."""


def test_each_target_gets_its_share_of_what_the_job_has_left() -> None:
    # 600 s jobs keep 30 s back (5%, at most 30 s); 20 s jobs 2 s (at least 2 s).
    assert time_budget.reserve(600) == 30 and time_budget.reserve(20) == 2
    assert time_budget.share(330, 600, 3, None) == pytest.approx(100)
    assert time_budget.share(330, 600, 1, None) == pytest.approx(300)
    assert time_budget.share(330, 600, 3, 50) == 50  # the option, when it fits
    assert time_budget.share(330, 600, 3, 1000) == pytest.approx(300)  # never past the job
    assert time_budget.share(10, 600, 2, None) == 0  # nothing left


def test_a_budget_stops_a_sleep_in_the_main_thread() -> None:
    started = time.monotonic()
    with pytest.raises(time_budget.TargetTimeout), time_budget.limit(0.2):
        time.sleep(30)
    assert time.monotonic() - started < 5


def test_a_budget_stops_python_code_in_another_thread() -> None:
    caught: list[BaseException] = []

    def spin() -> None:
        try:
            with time_budget.limit(0.2):
                while True:
                    sum(range(1000))
        except time_budget.TargetTimeout as exc:
            caught.append(exc)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert len(caught) == 1


def test_a_deferred_exchange_is_never_cut_and_the_budget_is_raised_after_it() -> None:
    started = time.monotonic()
    finished = False
    with pytest.raises(time_budget.TargetTimeout), time_budget.limit(0.1), time_budget.deferred():
        time.sleep(0.5)
        finished = True
    assert finished and time.monotonic() - started >= 0.5


def test_a_swallowed_budget_still_ends_the_block_in_its_exception() -> None:
    with (
        pytest.raises(time_budget.TargetTimeout),
        time_budget.limit(0.1),
        contextlib.suppress(BaseException),
    ):
        time.sleep(30)


def test_a_budget_never_cuts_an_import_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "budget_slow_import.py").write_text("import time\ntime.sleep(0.5)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(time_budget.TargetTimeout), time_budget.limit(0.1):
        import budget_slow_import  # noqa: F401

        while True:  # raised here, once the import is done
            time.sleep(0.01)
    assert sys.modules["budget_slow_import"].DONE is True


def _export(tmp_path: Path, model: str, options: dict[str, Any], **request: Any) -> Any:
    seen: dict[str, dict[str, Any]] = {}
    partial = tmp_path / "out" / PROVISIONAL_REPORT

    def progress(p: Progress) -> None:  # the provisional report as each phase starts
        if partial.exists():
            seen[f"{p.stage}:{p.message}"] = json.loads(partial.read_text())

    result = run_export(
        ExportRequest(
            upload=Upload(model=MODELS / model),
            options=ExportOptions.model_validate(options),
            out_dir=tmp_path / "out",
            work_dir=tmp_path / "work",
            **request,
        ),
        progress=progress,
    )
    return result, seen


def test_a_target_over_its_budget_fails_alone_and_the_program_is_kept(tmp_path: Path) -> None:
    result, seen = _export(
        tmp_path, "target_slow.py", {"targets": ["onnx"], "target_timeout_s": 1, **QUICK}
    )
    assert seen == {}  # no provisional report unless the request asks for one
    report = result.report
    assert report.status == "succeeded" and report.error is None
    assert (tmp_path / "out" / "program.pt2").is_file()
    assert not (tmp_path / "out" / "model.onnx").exists()
    onnx = report.targets["onnx"]
    assert onnx.status == "failed" and onnx.error is not None
    assert onnx.error.code == "target_failed"
    details = onnx.error.details
    assert (details["target"], details["reason"], details["limit"]) == (
        "onnx",
        "timeout",
        "target_timeout_s",
    )
    assert details["budget_s"] == 1
    assert [w.details["reason"] for w in report.warnings if w.code == "target_failed"] == [
        "timeout"
    ]


def test_the_provisional_report_says_what_a_stop_by_the_time_limit_would_leave(
    tmp_path: Path,
) -> None:
    result, seen = _export(
        tmp_path,
        "service_small.py",
        {"targets": ["onnx"], "verify": {"samples": 0, "roundtrip": False}},
        provisional_report=True,
        time_limit_s=300,
    )
    assert result.report.status == "succeeded"
    assert not (tmp_path / "out" / PROVISIONAL_REPORT).exists()  # report.json says it all
    # While onnx converts: the job succeeds with its program, onnx stopped by timeout_s.
    converting = seen["converting:onnx: loading"]
    assert converting["status"] == "succeeded"
    assert (converting["stages"][-1]["name"], converting["stages"][-1]["status"]) == (
        "converting",
        "failed",
    )
    assert converting["verification"]["passed"] is True
    error = converting["targets"]["onnx"]["error"]
    assert error["code"] == "target_failed"
    assert {k: error["details"][k] for k in ("target", "reason", "limit", "timeout_s")} == {
        "target": "onnx",
        "reason": "timeout",
        "limit": "timeout_s",
        "timeout_s": 300,
    }
    # While profiling: onnx succeeded; warning `timeout` names the stage.
    profiling = seen["profiling:profiling done"]
    assert profiling["targets"]["onnx"]["status"] == "succeeded"
    assert profiling["profile"] is None
    assert [w["details"] for w in profiling["warnings"] if w["code"] == "timeout"] == [
        {"stage": "profiling", "timeout_s": 300}
    ]


def test_with_targets_required_the_provisional_report_fails_with_the_target(
    tmp_path: Path,
) -> None:
    _, seen = _export(
        tmp_path,
        "service_small.py",
        {"targets": ["onnx"], "targets_required": True, **QUICK},
        provisional_report=True,
    )
    converting = seen["converting:onnx: loading"]
    assert converting["status"] == "failed"
    assert converting["error"]["code"] == "target_failed"
    assert converting["error"]["details"]["reason"] == "timeout"
