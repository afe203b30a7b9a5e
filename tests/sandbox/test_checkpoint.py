"""A checkpoint zip (a `save_pretrained` directory) exports inside the real sandbox: the
engine builds the model from config.json and the safetensors there (issue 20)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from schemas import ExportOptions
from tests.engine.test_checkpoints import bert, zip_directory
from tests.sandbox.conftest import Arena
from worker.sandbox import SandboxJob

pytest.importorskip("transformers")


def test_a_checkpoint_zip_exports_in_the_sandbox(arena: Arena) -> None:
    root = Path(tempfile.mkdtemp(dir=arena.root))
    archive = zip_directory(bert(root), root / "bert.zip")
    archive.chmod(0o644)
    result = arena.runner.run(
        SandboxJob(
            model=archive,
            inputs=None,
            weights=None,
            options=ExportOptions.model_validate(
                {"decomposition": {"mode": "none"}, "verify": {"samples": 0}}
            ),
            job_dir=Path(tempfile.mkdtemp(dir=arena.root)),
        )
    )
    assert result.error is None, result.error
    report = result.report
    assert report.checkpoint is not None
    assert (report.checkpoint.task, report.checkpoint.task_source) == ("fill-mask", "architectures")
    assert report.tracing.dynamic_shapes.source == "checkpoint"
    assert report.verification is not None and report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    assert "program.pt2" in result.artifacts
