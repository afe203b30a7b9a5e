"""A tiny Qwen3 checkpoint exported generation-ready inside the real sandbox, with the
`aoti` target (its compiler runs through the sandbox's toolchain broker), each greedy
generation matched against eager transformers (issue 20). Every target's generation is
tests/engine/test_generation.py's (a Llama) and bench/hf_checkpoints.py's (both). A tiny
Llama's `model.pte` runs in ExecuTorch's own LLM runner inside the sandbox too."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from schemas import ExportOptions
from tests.engine.test_checkpoints import zip_directory
from tests.engine.test_executorch_runner import byte_level_tokenizer
from tests.engine.test_generation import llama, qwen3
from tests.sandbox.conftest import Arena
from worker.sandbox import SandboxJob

pytest.importorskip("transformers")


def _run(arena: Arena, archive: Path, options: dict[str, object]) -> Any:
    """The job of `archive` with `options`, in the arena's sandbox."""
    return arena.runner.run(
        SandboxJob(
            model=archive,
            inputs=None,
            weights=None,
            options=ExportOptions.model_validate(options),
            job_dir=Path(tempfile.mkdtemp(dir=arena.root)),
        )
    )


@pytest.mark.slow
def test_a_qwen3_checkpoint_generates_in_the_sandbox_and_its_aoti_package(arena: Arena) -> None:
    root = Path(tempfile.mkdtemp(dir=arena.root))
    archive = zip_directory(qwen3(root), root / "qwen3.zip")
    archive.chmod(0o644)
    options = {"task": "text-generation", "targets": ["aoti"]}
    result = _run(arena, archive, options)
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


@pytest.mark.slow
def test_a_llama_pte_generates_in_textllmrunner_inside_the_sandbox(arena: Arena) -> None:
    """ExecuTorch's LLM runner runs in the job under its seccomp and Landlock rules, with
    the checkpoint's tokenizer beside the `.pte`."""
    root = Path(tempfile.mkdtemp(dir=arena.root))
    directory = llama(root)
    byte_level_tokenizer(directory)
    archive = zip_directory(directory, root / "llama.zip")
    archive.chmod(0o644)
    options = {"task": "text-generation", "targets": ["executorch"], "verify": {"roundtrip": False}}
    result = _run(arena, archive, options)
    assert result.error is None, result.error
    target = result.report.targets["executorch"]
    assert target.status == "succeeded", target.error
    in_runtime = target.runtime_generation
    assert in_runtime is not None and in_runtime.passed is True, target.notes
    assert len(in_runtime.runs) == 2 and all(run.matched for run in in_runtime.runs)
    assert any("TextLLMRunner loads it" in note for note in target.notes), target.notes
    assert {"model.pte", "tokenizer.json"} <= set(result.artifacts)
