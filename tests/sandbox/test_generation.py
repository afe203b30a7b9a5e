"""A tiny Qwen3 checkpoint exported generation-ready inside the real sandbox, with every
target, each artifact's greedy generation matched against eager transformers (issue 20)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from schemas import ExportOptions
from tests.engine.test_checkpoints import zip_directory
from tests.engine.test_generation import qwen3
from tests.sandbox.conftest import Arena
from worker.sandbox import SandboxJob

pytest.importorskip("transformers")


@pytest.mark.slow
def test_a_qwen3_checkpoint_generates_in_every_target_through_the_sandbox(arena: Arena) -> None:
    root = Path(tempfile.mkdtemp(dir=arena.root))
    archive = zip_directory(qwen3(root), root / "qwen3.zip")
    archive.chmod(0o644)
    options = {"task": "text-generation", "targets": ["onnx", "aoti", "executorch"]}
    result = arena.runner.run(
        SandboxJob(
            model=archive,
            inputs=None,
            weights=None,
            options=ExportOptions.model_validate(options),
            job_dir=Path(tempfile.mkdtemp(dir=arena.root)),
        )
    )
    assert result.error is None, result.error
    report = result.report
    assert report.generation is not None and report.generation.check is not None
    assert report.generation.check.matched
    assert report.verification is not None and report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    for name in ("onnx", "aoti", "executorch"):
        target = report.targets[name]
        assert target.status == "succeeded", (name, target.error)
        assert target.generation is not None and target.generation.matched, name
    assert {"program.pt2", "model.onnx", "model.aoti.pt2", "model.pte"} <= set(result.artifacts)
