"""Real models through the sandboxed engine: a CI selection of bench/model_suite/.

Each upload (a tiny random-weight transformers or diffusers model) runs as a job on one
session-wide `SandboxRunner`, so the zygote starts once. Per model: the job succeeded,
verification against eager passed and the torch-only round trip passed. The whole suite,
with plain torch beside it, is `python bench/model_suite.py` (docs/models.md).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import ExportOptions
from worker.sandbox import SandboxJob, SandboxResult, SandboxRunner, SandboxSettings

SUITE = Path(__file__).resolve().parents[2] / "bench" / "model_suite"

# Small and quick (a few seconds each), and one of each kind the suite covers.
MODELS = {
    "hf_bert": "transformers",
    "hf_bert_dynamic": "transformers",
    "hf_distilbert": "transformers",
    "hf_electra": "transformers",
    "hf_llama": "transformers",
    "hf_qwen2": "transformers",
    "hf_gpt_neo": "transformers",
    "hf_llama_kv_cache": "transformers",
    "hf_t5": "transformers",
    "hf_vit": "transformers",
    "hf_resnet": "transformers",
    "diffusers_vae": "diffusers",
}


@pytest.fixture(scope="session")
def work_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="torchport-model-suite-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def runner(work_root: Path) -> Iterator[SandboxRunner]:
    with SandboxRunner(SandboxSettings(work_root=work_root / "work")) as started:
        yield started


def run_model(runner: SandboxRunner, work_root: Path, name: str) -> SandboxResult:
    job_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work_root))
    job = SandboxJob(
        model=SUITE / f"{name}.py",
        inputs=None,
        weights=None,
        options=ExportOptions(),
        job_dir=job_dir,
    )
    return runner.run(job)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_suite_model_exports_verified_and_round_trips(
    runner: SandboxRunner, work_root: Path, name: str
) -> None:
    pytest.importorskip(MODELS[name])
    result = run_model(runner, work_root, name)
    report = result.report
    assert report.status == "succeeded", result.error
    assert report.verification is not None
    failed = [s.label for s in report.verification.samples if s.status == "failed"]
    assert report.verification.passed is True, f"verification failed on samples {failed}"
    roundtrip = report.verification.roundtrip
    assert roundtrip is not None
    assert roundtrip.status == "passed", roundtrip.reason
    assert "program.pt2" in result.artifacts
