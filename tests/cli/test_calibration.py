"""`--calibration` of `torchport export`: a usage error without `--quantize int8`, and
a sandboxed int8 export calibrated on the file (an inputs file of the same name beside
it: each upload arrives in the sandbox under its own role)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

MODELS = Path(__file__).parents[1] / "models"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", "export", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _calibration(path: Path, count: int) -> Path:
    generator = torch.Generator().manual_seed(0)
    tensors = {f"{n}.args.0": torch.randn(4, 3, 32, 32, generator=generator) for n in range(count)}
    safetensors.torch.save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("scheme", [None, "int8_dynamic"])
def test_calibration_without_int8_is_a_usage_error(tmp_path: Path, scheme: str | None) -> None:
    calibration = _calibration(tmp_path / "calib.safetensors", 2)
    quantize = ["--quantize", scheme] if scheme else []
    result = _cli(
        str(MODELS / "quant_cnn.py"),
        "--calibration",
        str(calibration),
        *quantize,
        "--json",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2, result.stderr[-2000:]
    body = json.loads(result.stdout)
    assert body["code"] == "invalid_request"
    assert body["details"]["reason"] == "calibration_unused"
    assert not (tmp_path / "out").exists()


def test_a_sandboxed_int8_export_is_calibrated_on_the_file(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    inputs = tmp_path / "a" / "data.safetensors"
    safetensors.torch.save_file({"args.0": torch.randn(3, 3, 32, 32)}, str(inputs))
    calibration = _calibration(tmp_path / "b" / "data.safetensors", 5)
    out = tmp_path / "out"
    result = _cli(
        str(MODELS / "quant_cnn.py"),
        "--inputs",
        str(inputs),
        "--calibration",
        str(calibration),
        "--target",
        "onnx",
        "--quantize",
        "int8",
        "--no-profile",
        "--json",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert "zygote" in report["sandbox"]["layers"]  # run in the sandbox, not in-process
    assert [leaf["shape"] for leaf in report["inputs"]] == [[3, 3, 32, 32]]
    quantization = report["quantization"]
    assert (quantization["calibration_source"], quantization["calibration_samples"]) == (
        "upload",
        5,
    )
    assert report["targets"]["onnx"]["status"] == "succeeded"
    assert quantization["targets"]["onnx"]["passed"] is True
