"""The whole engine through `run_export`: report always written, artifacts only on success."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from engine.serialize.artifacts import ARTIFACT_NAMES
from schemas import ExportOptions, Progress, ReportDocument

MODELS = Path(__file__).parents[1] / "models"
SCHEMAS = Path(__file__).parents[2] / "schemas" / "json"


def export(tmp_path: Path, model: str, options: dict[str, Any] | None = None, **kw: Any):
    request = ExportRequest(
        upload=Upload(model=MODELS / model),
        options=ExportOptions.model_validate(options or {}),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    return run_export(request, **kw)


def test_success_writes_every_artifact_valid_against_its_json_schema(tmp_path: Path) -> None:
    events: list[Progress] = []
    result = export(tmp_path, "docs_shared_batch.py", progress=events.append)
    assert result.succeeded
    assert set(result.artifacts) == set(ARTIFACT_NAMES)
    for name in ("graph", "signature", "report"):
        document = json.loads((tmp_path / "out" / f"{name}.json").read_text())
        schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        jsonschema.validate(document, schema)
        assert document["schema_version"] == "1.0"
    report = ReportDocument.model_validate_json((tmp_path / "out" / "report.json").read_text())
    sizes = {a.name: a.size for a in report.artifacts}
    assert sizes["program.pt2"] == (tmp_path / "out" / "program.pt2").stat().st_size
    stages = [(e.stage, e.fraction) for e in events]
    assert stages[0] == ("loading", 0.0) and stages[-1] == ("serializing", 1.0)
    assert [s for s, f in stages if f == 1.0] == [
        "loading",
        "tracing",
        "decomposing",
        "verifying",
        "serializing",
    ]
    # each stage's memory peak: at least the interpreter with torch loaded
    peaks = [stage.peak_rss_mb for stage in report.stages]
    assert all(peak is not None and peak > 50 for peak in peaks), peaks
    assert document["stages"][0]["peak_rss_mb"] == peaks[0]


@pytest.mark.parametrize("verify", [True, False])
def test_model_failing_eagerly_is_eager_run_failed_with_or_without_verification(
    tmp_path: Path, verify: bool
) -> None:
    result = export(tmp_path, "load_eager_fails.py", {"verify": {"enabled": verify}})
    error = result.report.error
    assert error is not None and error.code == "eager_run_failed"
    assert error.location is not None and error.location.file == "load_eager_fails.py"
    assert error.location.line == 13
    assert not (tmp_path / "out" / "program.pt2").exists()
    assert set(result.artifacts) == {"report.json"}


def test_without_verification_non_portable_outputs_are_still_wrapped(tmp_path: Path) -> None:
    result = export(tmp_path, "verify_hf_output.py", {"verify": {"enabled": False}})
    assert result.succeeded
    assert [w.code for w in result.report.warnings] == ["outputs_made_portable"], [
        (w.code, w.message) for w in result.report.warnings
    ]
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    assert signature["portability"]["wrapped"] is True
    assert result.report.verification is None


def test_tracing_failure_keeps_attempts_draft_issues_and_no_program(tmp_path: Path) -> None:
    result = export(tmp_path, "diag_data_dependent.py")
    report = result.report
    assert report.status == "failed"
    assert report.error is not None and report.error.code == "data_dependent"
    assert report.error.location is not None and report.error.location.line == 8
    assert [s.status for s in report.stages] == ["succeeded", "failed"]
    assert len(report.tracing.attempts) == 1 and report.tracing.attempts[0].succeeded is False
    assert report.draft_export and report.draft_export[0].type == "data_dependent"
    assert not (tmp_path / "out" / "program.pt2").exists()


def test_no_server_path_leaks_into_the_report(tmp_path: Path) -> None:
    export(tmp_path, "diag_data_dependent.py")
    text = (tmp_path / "out" / "report.json").read_text()
    assert str(tmp_path) not in text
    assert str(MODELS) not in text


def test_outputs_that_differ_from_eager_fail_verification(tmp_path: Path) -> None:
    result = export(tmp_path, "pipeline_random.py", {"verify": {"samples": 0}})
    error = result.report.error
    assert error is not None and error.code == "verification_failed"
    assert error.stage == "verifying"
    assert error.details["sample"] == "example"
    assert error.details["max_abs_error"] > 0.1
    assert result.report.verification is not None
    assert result.report.verification.passed is False
    assert not (tmp_path / "out" / "program.pt2").exists()


def test_kept_types_torch_cannot_save_fail_serialization(tmp_path: Path) -> None:
    result = export(tmp_path, "pipeline_namedtuple_output.py", {"portable": False})
    error = result.report.error
    assert error is not None and error.code == "serialization_failed"
    assert error.stage == "serializing"
    assert [w.code for w in result.report.warnings][:1] == ["non_portable_types"]


def test_the_same_namedtuple_output_exports_when_portable(tmp_path: Path) -> None:
    result = export(tmp_path, "pipeline_namedtuple_output.py")
    assert result.succeeded
    assert result.report.verification is not None
    roundtrip = result.report.verification.roundtrip
    assert roundtrip is not None and roundtrip.bitwise_equal is True


def test_samples_the_program_itself_refuses_are_skipped_not_failed(tmp_path: Path) -> None:
    # torch's fix `dy = Dim('dy', max=5)` reports dy in [0, 5], while the program keeps a
    # runtime guard x.size(0) - 1 >= 2: the "min" sample lies outside that guard.
    result = export(tmp_path, "diag_derived.py")
    assert result.succeeded
    assert result.report.verification is not None
    samples = {s.label: s for s in result.report.verification.samples}
    assert samples["min"].status == "skipped"
    assert (samples["min"].reason or "").startswith("outside the program's guards")
    assert samples["max"].status == "passed"


def test_the_report_lists_the_inputs_when_tracing_fails(tmp_path: Path) -> None:
    result = export(tmp_path, "pipeline_mixed_inputs.py")
    assert result.report.error is not None and result.report.error.code == "data_dependent"
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = [
        (i["path"], i["name"], i["type"], i["shape"], i["dtype"], i["value"])
        for i in written["inputs"]
    ]
    assert rows == [
        ("args[0]", "x", "Tensor", [2, 3], "float32", None),
        ("args[1]['a']", "pair", "Tensor", [3], "float32", None),
        ("args[1]['b']", "pair", "Tensor", [2, 3], "float32", None),
        ("args[2]", "scale", "int", None, None, 2),
        ("kwargs['mask']", "mask", "Tensor", [2, 3], "bool", None),
    ]


@pytest.mark.parametrize("verify", [True, False])
def test_the_report_lists_the_inputs_when_the_eager_run_fails(tmp_path: Path, verify: bool) -> None:
    result = export(tmp_path, "load_eager_fails.py", {"verify": {"enabled": verify}})
    assert result.report.error is not None and result.report.error.code == "eager_run_failed"
    assert [(i.path, i.name, i.shape) for i in result.report.inputs] == [("args[0]", "x", [4, 3])]


def test_inputs_are_empty_when_loading_fails_before_them(tmp_path: Path) -> None:
    result = export(tmp_path, "load_no_model.py")
    assert result.report.error is not None and result.report.error.code == "model_not_found"
    assert result.report.inputs == []


def test_warnings_raised_while_exporting_are_reported_once_with_their_location(
    tmp_path: Path,
) -> None:
    result = export(tmp_path, "pipeline_warns.py", {"verify": {"enabled": False}})
    assert result.succeeded
    mine = [w for w in result.report.warnings if w.code == "torch_warning"]
    assert len(mine) == 1
    assert mine[0].details["category"] == "UserWarning"
    assert mine[0].details["location"]["file"] == "pipeline_warns.py"
    assert mine[0].details["location"]["line"] == 10


def test_resource_warnings_from_elsewhere_are_not_the_users_concern(tmp_path: Path) -> None:
    import warnings

    from engine.diagnostics.source_map import SourceMap
    from engine.pipeline.export import _torch_warnings

    def caught(category: type[Warning], filename: str) -> warnings.WarningMessage:
        return warnings.WarningMessage(f"unclosed file in {filename}", category, filename, 3)

    user_file = str(tmp_path / "model.py")
    reported = _torch_warnings(
        [
            caught(ResourceWarning, "/usr/lib/python3.11/socket.py"),  # gc ran during export
            caught(ResourceWarning, user_file),
            caught(UserWarning, "/site-packages/torch/export/x.py"),
        ],
        SourceMap(tmp_path),
    )
    assert [(w.details["category"], "location" in w.details) for w in reported] == [
        ("ResourceWarning", True),
        ("UserWarning", False),
    ]


def test_skipped_samples_make_program_and_target_partially_verified(tmp_path: Path) -> None:
    # The example index holds 7: every drawn size of 7 rows or fewer makes eager raise.
    options = {"verify": {"samples": 4}, "targets": ["onnx"], "targets_required": True}
    result = export(tmp_path, "verify_gather.py", options)
    assert result.succeeded, result.report.error
    report = result.report
    assert report.verification is not None
    assert report.verification.verdict == "partially_verified"
    assert report.verification.passed is True
    skipped = [s.label for s in report.verification.samples if s.status == "skipped"]
    assert "min" in skipped
    target = report.targets["onnx"].verification
    assert target is not None and target.verdict == "partially_verified"
    warnings = [w for w in report.warnings if w.code == "partially_verified"]
    assert [w.details.get("target") for w in warnings] == [None, "onnx"]
    for warning in warnings:
        assert [s["label"] for s in warning.details["samples"]] == skipped
        assert all(s["reason"] for s in warning.details["samples"])
        assert warning.details["skipped"] == len(skipped)
        assert warning.details["checked"] + len(skipped) == warning.details["total"]


def test_all_samples_passing_is_verified_without_a_warning(tmp_path: Path) -> None:
    result = export(tmp_path, "docs_shared_batch.py", {"targets": ["onnx"]})
    assert result.succeeded, result.report.error
    report = result.report
    assert report.verification is not None and report.verification.verdict == "verified"
    assert report.verification.skipped == 0
    target = report.targets["onnx"].verification
    assert target is not None and target.verdict == "verified"
    assert "partially_verified" not in [w.code for w in report.warnings]
