"""Weights on the command line (issue 34, item 5): `torchport submit --weights X.pth` is
taken by a real API process as `torchport export` takes it, and the summary names the
weights' missing and unexpected keys (the first 20, then how many more), for a
non-strict load as for a `weights_mismatch`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from rich.console import Console

from schemas import Environment, ErrorBody, ReportDocument, WeightsReport
from tests.cli.test_jobs import Server, pg_url, redis_prefix, server, torchport
from tests.service.conftest import MODELS
from torchport.summary import render_summary

__all__ = ["pg_url", "redis_prefix", "server"]

ENVIRONMENT = Environment(torchport="0", python="3", platform="linux")


def test_submit_sends_a_pth_weights_file(server: Server, tmp_path: Path) -> None:
    weights = tmp_path / "tiny.pth"
    torch.save({"model_state": {"w": torch.zeros(2)}, "step": 3}, weights)
    done = torchport(
        server, "submit", str(MODELS / "service_small.py"), "--weights", str(weights), "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["weights_name"] == "tiny.pth"


def _printed(report: ReportDocument, tmp_path: Path) -> str:
    console = Console(record=True, width=400)
    render_summary(report, console, tmp_path)
    return console.export_text()


def _names(text: str, pattern: str) -> list[str]:
    return re.findall(pattern, text)


def test_the_summary_names_the_keys_a_non_strict_load_skipped(tmp_path: Path) -> None:
    missing = [f"blocks.{i}.missing_weight" for i in range(25)]
    report = ReportDocument(
        status="succeeded",
        weights=WeightsReport(
            file="ckpt.pth",
            format="pt",
            key="model_state",
            strict=False,
            tensors=10,
            loaded=9,
            missing=missing,
            missing_count=25,
            unexpected=["head.extra[bold]"],
            unexpected_count=1,
        ),
        environment=ENVIRONMENT,
    )
    text = _printed(report, tmp_path)
    assert _names(text, r"blocks\.\d+\.missing_weight") == missing[:20]
    assert "25" in text and "5" in text
    assert "head.extra[bold]" in text  # printed as text, never as markup
    assert "ckpt.pth" in text and "model_state" in text


def test_the_summary_names_the_keys_of_a_weights_mismatch(tmp_path: Path) -> None:
    error = ErrorBody(
        code="weights_mismatch",
        message="The uploaded weights do not match the model: 1 missing, 30 unexpected.",
        stage="loading",
        details={
            "missing": ["offset"],
            "unexpected": [f"module.layer{i}" for i in range(30)],
            "shape_mismatch": [],
        },
    )
    report = ReportDocument(status="failed", error=error, environment=ENVIRONMENT)
    text = _printed(report, tmp_path)
    assert "offset" in text
    assert _names(text, r"module\.layer\d+") == [f"module.layer{i}" for i in range(20)]
