"""Every example of the torch.export documentation's overview, run through `torchport export`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MODELS = Path(__file__).parents[1] / "models"
pytestmark = pytest.mark.slow


def export(tmp_path: Path, model: str, *extra: str) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchport.cli",
            "export",
            str(MODELS / model),
            "--out",
            str(out),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert json.loads(result.stdout) == report
    return result.returncode, report, out


def signature(out: Path) -> dict[str, Any]:
    return json.loads((out / "signature.json").read_text())


def user_inputs(sig: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec for spec in sig["inputs"] if spec["kind"] == "user_input"]


def assert_verified(report: dict[str, Any]) -> None:
    verification = report["verification"]
    assert verification["passed"] is True
    assert verification["roundtrip"]["status"] == "passed"
    assert verification["roundtrip"]["bitwise_equal"] is True


def test_plain_function(tmp_path: Path) -> None:
    code, report, out = export(tmp_path, "docs_plain_function.py")
    assert code == 0 and report["status"] == "succeeded"
    assert {"aten.sin.default", "aten.cos.default", "aten.add.Tensor"} <= set(
        report["decomposition"]["ops_after"]
    )
    assert [spec["shape"] for spec in user_inputs(signature(out))] == [[10, 10], [10, 10]]
    assert [stage["name"] for stage in report["stages"]] == [
        "loading",
        "tracing",
        "decomposing",
        "verifying",
        "serializing",
    ]
    assert_verified(report)
    assert {"seccomp", "landlock", "rlimits"} <= set(report["sandbox"]["layers"])
    assert report["verification"]["roundtrip"]["loader"] == "sandbox"
    assert {a["name"] for a in report["artifacts"]} == {
        "program.pt2",
        "graph.json",
        "signature.json",
    }


def test_kwargs_with_inplace_add(tmp_path: Path) -> None:
    code, report, out = export(tmp_path, "docs_kwargs_inplace.py")
    assert code == 0
    sig = signature(out)
    assert "user_input_mutation" in [spec["kind"] for spec in sig["outputs"]]
    assert len(user_inputs(sig)) == 2
    assert_verified(report)


def test_conv_batchnorm_preserving_conv2d(tmp_path: Path) -> None:
    # The docs' model is in training mode: kept so (option training), batchnorm updates
    # its running statistics, which the program returns as buffer mutations.
    options = json.dumps(
        {
            "decomposition": {"mode": "core_aten", "preserve": ["aten.conv2d.default"]},
            "training": "preserve",
        }
    )
    code, report, out = export(tmp_path, "docs_conv_batchnorm.py", "--options", options)
    assert code == 0
    ops_after = report["decomposition"]["ops_after"]
    assert "aten.conv2d.default" in ops_after
    assert "aten.convolution.default" not in ops_after
    mutated = [
        spec["target"] for spec in signature(out)["outputs"] if spec["kind"] == "buffer_mutation"
    ]
    assert sorted(mutated) == ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
    example = report["verification"]["samples"][0]
    assert len(example["buffers"]) == 3 and all(b["passed"] for b in example["buffers"])
    assert_verified(report)
    [warning] = [w for w in report["warnings"] if w["code"] == "model_in_training_mode"]
    assert warning["details"]["exported_in"] == "training"


def test_shared_batch_dimension(tmp_path: Path) -> None:
    spec = {"x1": {"0": {"name": "batch", "min": 1, "max": 1024}}, "x2": {"0": "batch"}}
    code, report, out = export(
        tmp_path, "docs_shared_batch.py", "--dynamic-shapes", json.dumps(spec)
    )
    assert code == 0
    sig = signature(out)
    first, second = user_inputs(sig)
    assert isinstance(first["shape"][0], str) and first["shape"][0] == second["shape"][0]
    assert [first["shape"][1], second["shape"][1]] == [64, 128]
    assert len(sig["range_constraints"]) == 1
    assert sig["range_constraints"][0]["max"] == 1024
    labels = [s["label"] for s in report["verification"]["samples"] if s["status"] == "passed"]
    assert {"example", "min", "max"} <= set(labels)


def test_derived_dims_given_directly(tmp_path: Path) -> None:
    spec = {"x": {"0": {"name": "dimx", "min": 3, "max": 6}}, "y": {"0": "dimx+1"}}
    code, report, out = export(
        tmp_path, "docs_derived_dims.py", "--dynamic-shapes", json.dumps(spec)
    )
    assert code == 0
    x, y = user_inputs(signature(out))
    assert isinstance(x["shape"][0], str) and isinstance(y["shape"][0], str)
    assert report["tracing"]["dynamic_shapes"]["fixes"] == []
    assert_verified(report)


def test_derived_dims_found_by_auto_fix(tmp_path: Path) -> None:
    spec = {
        "x": {"0": {"name": "dimx", "min": 3, "max": 6}},
        "y": {"0": {"name": "dimy", "min": 4, "max": 7}},
    }
    code, report, _ = export(tmp_path, "docs_derived_dims.py", "--dynamic-shapes", json.dumps(spec))
    assert code == 0
    shapes = report["tracing"]["dynamic_shapes"]
    assert shapes["requested"] == spec
    assert len(shapes["fixes"]) >= 1
    assert shapes["applied"]["y"]["0"] == "dimx+1"
    assert len(report["tracing"]["attempts"]) >= 2


def test_non_strict_context_manager(tmp_path: Path) -> None:
    code, report, _ = export(tmp_path, "docs_context_manager.py")
    assert code == 0
    assert report["tracing"]["strict_used"] is False
    assert_verified(report)


def test_shape_dependent_control_flow_is_auto_fixed(tmp_path: Path) -> None:
    code, report, out = export(tmp_path, "docs_shape_control_flow.py")
    assert code == 0
    shapes = report["tracing"]["dynamic_shapes"]
    assert shapes["source"] == "module"
    assert shapes["fixes"]
    (constraint,) = signature(out)["range_constraints"]
    assert constraint["min"] == 6 and constraint["max"] == 16


def test_shape_dependent_control_flow_without_auto_fix(tmp_path: Path) -> None:
    options = json.dumps({"auto_fix_dynamic_shapes": False})
    code, report, out = export(tmp_path, "docs_shape_control_flow.py", "--options", options)
    assert code == 1
    error = report["error"]
    assert error["code"] == "dynamic_shape_violation"
    assert error["stage"] == "tracing"
    assert error["details"]["suggested_fixes"]
    assert not (out / "program.pt2").exists()


def test_int_input_is_specialized(tmp_path: Path) -> None:
    code, report, out = export(tmp_path, "docs_int_specialization.py")
    assert code == 0
    constants = [spec for spec in signature(out)["inputs"] if spec.get("value") == 3]
    assert len(constants) == 1
    assert_verified(report)


def test_bare_tensor_example_and_model_class(tmp_path: Path) -> None:
    code, report, out = export(tmp_path, "docs_bare_tensor.py")
    assert code == 0
    assert [spec["shape"] for spec in user_inputs(signature(out))] == [[3, 4]]
    assert_verified(report)


def test_usage_error_exits_2_with_error_body(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchport.cli",
            "export",
            str(MODELS / "docs_bare_tensor.py"),
            "--json",
            "--options",
            '{"strict": "sometimes"}',
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    body = json.loads(result.stdout)
    assert body["code"] == "invalid_request"
    assert body["details"]["errors"][0]["field"].startswith("strict")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", "export", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_several_models_share_one_sandbox(tmp_path: Path) -> None:
    names = ["docs_plain_function.py", "load_no_model.py", "docs_bare_tensor.py"]
    result = _cli(*(str(MODELS / n) for n in names), "--out", str(tmp_path))
    assert result.returncode == 1, result.stderr[-3000:]  # one of them failed
    reports = {n: json.loads((tmp_path / n[:-3] / "report.json").read_text()) for n in names}
    assert reports["docs_plain_function.py"]["status"] == "succeeded"
    assert reports["load_no_model.py"]["error"]["code"] == "model_not_found"
    assert reports["docs_bare_tensor.py"]["status"] == "succeeded"
    for name in ("docs_plain_function.py", "docs_bare_tensor.py"):
        assert_verified(reports[name])
        assert (tmp_path / name[:-3] / "program.pt2").is_file()
    # One zygote served all three, in order.
    assert [reports[n]["sandbox"]["details"]["zygote_job"] for n in names] == [1, 2, 3]


def test_inputs_with_several_models_is_a_usage_error(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.json"
    inputs.write_text("{}")
    result = _cli(
        str(MODELS / "docs_plain_function.py"),
        str(MODELS / "docs_bare_tensor.py"),
        "--inputs",
        str(inputs),
        "--json",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2
    assert json.loads(result.stdout)["code"] == "invalid_request"
    assert not (tmp_path / "out").exists()
