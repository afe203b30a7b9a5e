"""Mixture-of-experts language models of transformers 5 (tiny configs, random weights)
export, verify against the model as given and load in a process that imported only
torch; their ONNX and ExecuTorch targets convert and verify."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.model_files import export_file as export

pytest.importorskip("transformers")

MOE_MODELS = ["hf_mixtral.py", "hf_qwen3_moe.py", "hf_deepseek_v3.py"]


def _aten_only(program: Path) -> bool:
    ep = torch.export.load(program)
    return all(
        node.target.namespace == "aten"
        for node in ep.graph.nodes
        if isinstance(node.target, torch._ops.OpOverload)
    )


@pytest.mark.slow
@pytest.mark.parametrize("model", MOE_MODELS)
def test_moe_model_exports_verifies_and_loads_torch_only(tmp_path: Path, model: str) -> None:
    result = export(tmp_path, model)
    report = result.report
    assert result.succeeded, report.error
    (adapted,) = [w for w in report.warnings if w.code == "library_adapted"]
    assert adapted.details["before"] == {"": "grouped_mm"}
    assert adapted.details["after"] == {"": "batched_mm"}
    assert report.verification is not None and report.verification.passed is True
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    assert report.verification.roundtrip.bitwise_equal is True
    assert _aten_only(tmp_path / "out" / "program.pt2")


@pytest.mark.slow
def test_moe_model_converts_to_onnx_and_executorch(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("executorch")
    result = export(
        tmp_path,
        "hf_qwen3_moe.py",
        {
            "targets": ["onnx", "executorch"],
            "verify": {"roundtrip": False},
            "profile": {"enabled": False},
        },
    )
    assert result.succeeded, result.report.error
    for name in ("onnx", "executorch"):
        target = result.report.targets[name]
        assert target.status == "succeeded", (name, target.error)
        assert target.verification is not None and target.verification.passed is True
