"""The CLI's summary: a partly skipped verification is never shown as verified."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from schemas import (
    EncoderReport,
    Environment,
    GenerationCheck,
    GenerationReport,
    ReportDocument,
    RoundtripCheck,
    SampleCheck,
    TargetResult,
    VerificationReport,
)
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
