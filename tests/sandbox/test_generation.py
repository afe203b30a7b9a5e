"""A tiny Qwen3 checkpoint exported generation-ready inside the real sandbox, with the
`aoti` target (its compiler runs through the sandbox's toolchain broker), each greedy
generation matched against eager transformers (issue 20). Every target's generation is
tests/engine/test_generation.py's (a Llama) and bench/hf_checkpoints.py's (both)."""

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
def test_a_qwen3_checkpoint_generates_in_the_sandbox_and_its_aoti_package(arena: Arena) -> None:
    root = Path(tempfile.mkdtemp(dir=arena.root))
    archive = zip_directory(qwen3(root), root / "qwen3.zip")
    archive.chmod(0o644)
    options = {"task": "text-generation", "targets": ["aoti"]}
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
    target = report.targets["aoti"]
    assert target.status == "succeeded", target.error
    assert target.generation is not None and target.generation.matched
    assert target.generation.expected == report.generation.check.expected
    assert {"program.pt2", "model.aoti.pt2"} <= set(result.artifacts)
