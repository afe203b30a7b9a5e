"""The CLI's summary: a partly skipped verification is never shown as verified; the
artifacts table puts the best deployable choice first."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ConfigDict
from rich.console import Console

from schemas import (
    ArtifactProfile,
    EncoderReport,
    Environment,
    GenerationCheck,
    GenerationReport,
    GenerationRun,
    LatencyProfile,
    MachineProfile,
    ProfileReport,
    ReportDocument,
    RoundtripCheck,
    SampleCheck,
    TargetResult,
    VerificationReport,
)
from torchport.artifact_table import artifact_rows
from torchport.summary import generation_text, render_summary, verdict_text


def _verification(*statuses: str) -> VerificationReport:
    samples = [
        SampleCheck.model_validate(
            {"label": label, "status": status, "reason": "eager run: IndexError"}
            if status == "skipped"
            else {"label": label, "status": status}
        )
        for label, status in zip(["example", "min", "max", "random-1"], statuses, strict=False)
    ]
    return VerificationReport(enabled=True, passed=True, samples=samples)


def test_partial_verification_shows_checked_total_and_skipped() -> None:
    partial = _verification("passed", "skipped", "passed", "skipped")
    assert partial.verdict == "partially_verified"
    text = verdict_text(partial)
    assert re.findall(r"\d+", text) == ["2", "4", "2"]
    full = _verification("passed", "passed", "passed", "passed")
    assert full.verdict == "verified"
    assert verdict_text(full) != text
    assert text not in {verdict_text(VerificationReport(enabled=False))}


def test_the_summary_prints_the_verdict_of_the_program_and_of_each_target(
    tmp_path: Path,
) -> None:
    partial = _verification("passed", "skipped", "passed", "skipped")
    report = ReportDocument(
        status="succeeded",
        verification=partial,
        targets={
            "onnx": TargetResult(status="succeeded", verification=partial),
            "aoti": TargetResult(status="succeeded", verification=_verification("passed")),
        },
        environment=Environment(torchport="0", python="3", platform="linux"),
    )
    console = Console(record=True, width=200)
    render_summary(report, console, tmp_path)
    lines = console.export_text().splitlines()
    partial_text = verdict_text(partial)
    assert sum(partial_text in line for line in lines) == 2  # the program and onnx
    assert sum(verdict_text(_verification("passed")) in line for line in lines) == 1


def test_the_summary_says_whether_each_generation_matched(tmp_path: Path) -> None:
    matched = GenerationCheck(
        max_new_tokens=3, prompt_tokens=16, matched=True, expected=[1, 2, 3], generated=[1, 2, 3]
    )
    differs = GenerationCheck(
        max_new_tokens=3,
        prompt_tokens=16,
        matched=False,
        first_mismatch=1,
        expected=[1, 2, 3],
        generated=[1, 7, 3],
    )
    report = ReportDocument(
        status="succeeded",
        generation=GenerationReport(max_cache_len=64, check=matched),
        targets={
            "onnx": TargetResult(status="succeeded", generation=matched),
            "aoti": TargetResult(status="failed", generation=differs),
        },
        environment=Environment(torchport="0", python="3", platform="linux"),
    )
    console = Console(record=True, width=200)
    render_summary(report, console, tmp_path)
    lines = console.export_text().splitlines()
    assert sum(generation_text(matched) in line for line in lines) == 2  # program and onnx
    [aoti] = [line for line in lines if line.startswith("Target aoti")]
    assert generation_text(differs) in aoti and "1" in generation_text(differs)
    assert any("64" in line for line in lines if line.startswith("Generation"))


def test_the_summary_shows_the_prompts_and_which_restart_differs(tmp_path: Path) -> None:
    example, second = list(range(10, 26)), [7, 8, 9]
    restarts = [
        GenerationRun(
            prompt="second",
            prompt_ids=second,
            matched=False,
            first_mismatch=2,
            expected=[4, 5, 6],
            generated=[4, 5, 9],
        ),
        GenerationRun(prompt="example", prompt_ids=example, matched=True),
    ]
    check = GenerationCheck(
        max_new_tokens=3,
        prompt_tokens=16,
        matched=False,
        prompt_ids=example,
        expected=[1, 2, 3],
        generated=[1, 2, 3],
        runs=restarts,
    )
    report = ReportDocument(
        status="failed",
        generation=GenerationReport(max_cache_len=64, check=check),
        environment=Environment(torchport="0", python="3", platform="linux"),
    )
    console = Console(record=True, width=300)
    render_summary(report, console, tmp_path)
    lines = console.export_text().splitlines()
    [generation] = [line for line in lines if line.startswith("Generation")]
    assert generation.endswith(generation_text(check))
    # the token and the run (2: the second prompt) that differ, restarted at position 0
    assert re.findall(r"\d+", generation_text(check)) == ["2", "2", "0"]
    [prompts] = [line for line in lines if line.strip().startswith("prompts")]
    assert "[10 11 12 13 14 15 16 17 …] (16 tokens)" in prompts and "[7 8 9] (3 tokens)" in prompts
    passed = check.model_copy(update={"matched": True, "runs": restarts[1:]})
    assert re.findall(r"\d+", generation_text(passed)) == ["3", "2", "1", "0"]


def test_the_summary_shows_an_encoder_decoder_models_encoder(tmp_path: Path) -> None:
    encoder = EncoderReport(
        inputs=["input_ids"],
        input_shape=[1, "encoder_sequence_length"],
        verification=_verification("passed", "passed", "skipped"),
        roundtrip=RoundtripCheck(status="passed", bitwise_equal=True),
    )
    report = ReportDocument(
        status="succeeded",
        generation=GenerationReport(max_cache_len=64, encoder=encoder),
        environment=Environment(torchport="0", python="3", platform="linux"),
    )
    console = Console(record=True, width=200)
    render_summary(report, console, tmp_path)
    [line] = [line for line in console.export_text().splitlines() if line.startswith("Encoder")]
    assert "encoder.pt2" in line and "encoder_sequence_length" in line
    assert verdict_text(encoder.verification) in line and "partially" in line
    assert "round trip passed" in line


def _latency(threads: int, p50: float) -> LatencyProfile:
    return LatencyProfile(
        threads=threads,
        warmup=2,
        runs=20,
        budget_reached=False,
        p50_ms=p50,
        p90_ms=p50 * 1.5,
        mean_ms=p50 * 1.2,
        min_ms=p50 * 0.9,
        max_ms=p50 * 2,
    )


def _profiled(name: str, size: int | None, p50_one: float, p50_all: float) -> ArtifactProfile:
    kind = name if name in ("eager", "program") else "target"
    files = {"program": "program.pt2", "onnx": "model.onnx", "executorch": "model.pte"}
    return ArtifactProfile(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        artifact=files.get(name),
        size=size,
        runtime="test",
        load_s=None if kind == "eager" else 0.25,
        added_rss_mb=12.5,
        latency=[_latency(1, p50_one), _latency(4, p50_all)],
    )


def _profiled_report(**extra: Any) -> ReportDocument:
    verified = _verification("passed")
    data = ReportDocument(
        status="succeeded",
        verification=_verification("passed", "skipped"),
        targets={
            "onnx": TargetResult(status="succeeded", verification=verified),
            "executorch": TargetResult(status="succeeded", verification=verified),
        },
        profile=ProfileReport(
            machine=MachineProfile(cpu="Test CPU", architecture="x86_64", isa=["avx2"], threads=4),
            runs=20,
            warmup=2,
            budget_s=30,
            duration_s=3,
            artifacts=[
                _profiled("eager", None, 0.5, 0.2),
                _profiled("program", 3000, 0.4, 0.1),
                _profiled("onnx", 2000, 0.3, 0.3),
                _profiled("executorch", 1000, 0.2, 0.25),
            ],
        ),
        environment=Environment(torchport="0", python="3", platform="linux"),
    ).model_dump()

    class Quantized(ReportDocument):
        model_config = ConfigDict(extra="allow")

    return Quantized.model_validate({**data, **extra})


def test_the_artifacts_table_puts_the_best_deployable_choice_first(tmp_path: Path) -> None:
    report = _profiled_report()
    rows = artifact_rows(report)
    # Verified targets by p50 at 4 threads, then the partially verified program, eager last.
    assert [row.profile.name for row in rows] == ["executorch", "onnx", "program", "eager"]
    assert [row.verdict for row in rows] == [
        "verified",
        "verified",
        "partially_verified",
        "reference",
    ]
    assert (rows[0].p50_one, rows[0].p50_all) == (0.2, 0.25)
    assert all(row.accuracy is None for row in rows)
    console = Console(record=True, width=200)
    render_summary(report, console, tmp_path)
    lines = console.export_text().splitlines()
    header = next(i for i, line in enumerate(lines) if "p50 ms 1 thread" in line)
    assert "p50 ms 4 threads" in lines[header] and "accuracy" not in lines[header]
    body = lines[header + 2 : header + 2 + len(rows)]  # below the rule
    assert [line.split()[0] for line in body] == ["model.pte", "model.onnx", "program.pt2", "eager"]
    assert body[0].split()[1:5] == ["1000", "B", "0.200", "0.250"]
    assert body[2].split()[-2:] == ["partially", "verified"]


def test_the_artifacts_table_shows_accuracy_vs_float_when_quantized(tmp_path: Path) -> None:
    # report.quantization as the quantization engineer's schema writes it: by target name.
    quantization = {
        "scheme": "int8",
        "targets": {
            "executorch": {
                "measured": True,
                "passed": False,
                "outputs": [{"path": "[0]", "cosine": 0.95}, {"path": "[1]", "cosine": 0.97}],
            },
            "onnx": {"measured": True, "passed": True, "cosine": 0.9991, "top1_agreement": 1.0},
        },
    }
    rows = artifact_rows(_profiled_report(quantization=quantization))
    # Outside the accuracy budget goes after what is within it, whatever its speed.
    assert [row.profile.name for row in rows] == ["onnx", "executorch", "program", "eager"]
    assert [row.accurate for row in rows] == [True, False, None, None]
    assert rows[0].accuracy is not None and "0.9991" in rows[0].accuracy
    assert "100%" in rows[0].accuracy  # top-1 agreement
    assert rows[1].accuracy is not None and "0.9500" in rows[1].accuracy
    console = Console(record=True, width=200)
    render_summary(_profiled_report(quantization=quantization), console, tmp_path)
    assert any("accuracy vs float" in line for line in console.export_text().splitlines())


def test_an_unprofiled_report_prints_no_artifacts_table(tmp_path: Path) -> None:
    report = ReportDocument(
        status="succeeded", environment=Environment(torchport="0", python="3", platform="linux")
    )
    assert artifact_rows(report) == []
    console = Console(record=True, width=200)
    render_summary(report, console, tmp_path)
    assert not any("p50" in line for line in console.export_text().splitlines())


def test_the_jobs_table_names_each_jobs_targets() -> None:
    from datetime import UTC, datetime

    from schemas import JobSummary
    from torchport.job_view import render_jobs

    created = datetime(2026, 11, 27, tzinfo=UTC)
    items = [
        JobSummary(id="j-two", status="queued", created_at=created, targets=["onnx", "executorch"]),
        JobSummary(id="j-none", status="succeeded", created_at=created, finished_at=created),
    ]
    console = Console(record=True, width=200)
    render_jobs(items, console)
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "status" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][-1] == "targets"
    two = next(line for line in lines if "j-two" in line)
    none = next(line for line in lines if "j-none" in line)
    assert "onnx, executorch" in two
    assert "onnx" not in none and "executorch" not in none
