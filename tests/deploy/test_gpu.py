"""The GPU path: `device: "cuda"` end to end, and a clear failure where there is no GPU.

Tests marked `cuda` need a CUDA device and skip only when torch sees none; `bench/gpu.py`
runs them on a GPU machine. The no-GPU test runs everywhere (it hides the GPUs itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMER = ROOT / "examples" / "tiny_transformer.py"
CONV_MODEL = ROOT / "tests" / "models" / "docs_conv_batchnorm.py"
BF16_MODEL = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
model = model.to(torch.bfloat16).eval()
example_args = (torch.randn(4, 64, dtype=torch.bfloat16),)
"""

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def _export(model: Path, out: Path, options: dict[str, object], env: dict[str, str] | None = None):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchport.cli",
            "export",
            str(model),
            "--options",
            json.dumps(options),
            "--out",
            str(out),
            "--json",
        ],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads((out / "report.json").read_text())
    return completed.returncode, report


def test_cuda_job_without_a_gpu_fails_instead_of_running_on_the_cpu(tmp_path: Path) -> None:
    code, report = _export(
        TRANSFORMER, tmp_path / "out", {"device": "cuda"}, env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert code == 1
    assert report["status"] == "failed"
    assert report["error"]["code"] == "invalid_request"
    assert report["error"]["details"]["device"] == "cuda"
    assert report["error"]["stage"] == "loading"
    assert report["environment"]["device"] == "cuda"
    assert not (tmp_path / "out" / "program.pt2").exists()


@pytest.mark.cuda
@needs_cuda
def test_cuda_export_runs_on_the_gpu_and_names_it(tmp_path: Path) -> None:
    code, report = _export(TRANSFORMER, tmp_path / "out", {"device": "cuda"})
    assert code == 0, report.get("error")
    environment = report["environment"]
    assert environment["device"] == "cuda"
    assert environment["gpu"] == torch.cuda.get_device_name(0)
    assert environment["cuda"] == torch.version.cuda
    assert environment["torch"] == torch.__version__
    # Our own model file: loading the program here is safe.
    program = torch.export.load(tmp_path / "out" / "program.pt2")
    devices = {t.device.type for t in program.state_dict.values()}
    assert devices == {"cuda"}
    assert report["verification"]["passed"] is True


@pytest.mark.cuda
@needs_cuda
def test_cuda_bfloat16_verifies_with_bfloat16_tolerances(tmp_path: Path) -> None:
    model = tmp_path / "bf16.py"
    model.write_text(BF16_MODEL)
    code, report = _export(model, tmp_path / "out", {"device": "cuda"})
    assert code == 0, report.get("error")
    outputs = report["verification"]["samples"][0]["outputs"]
    assert outputs
    for output in outputs:
        assert output["passed"] is True
        assert output["atol"] == pytest.approx(1e-3)
        assert output["rtol"] == pytest.approx(1.6e-2)


@pytest.mark.cuda
@needs_cuda
def test_cuda_convolution_with_tf32_verifies(tmp_path: Path) -> None:
    # cuDNN runs float32 convolutions in TF32 by default (10-bit mantissas): the float32
    # tolerances must absorb the difference between eager and exported kernels.
    assert torch.backends.cudnn.allow_tf32 is True
    code, report = _export(CONV_MODEL, tmp_path / "out", {"device": "cuda"})
    assert code == 0, report.get("error")
    assert report["verification"]["passed"] is True
