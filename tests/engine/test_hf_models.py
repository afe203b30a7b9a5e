"""Real-world export problems of Hugging Face / diffusers models, on tiny random models
built from configs (no downloads): each is handled and reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch

from engine.pipeline.export import ExportResult
from tests.engine.model_files import export_file as export


def _warning(result: ExportResult, code: str) -> Any:
    found = [w for w in result.report.warnings if w.code == code]
    assert len(found) == 1, [(w.code, w.message) for w in result.report.warnings]
    return found[0]


# --- a decomposed program that does not run -------------------------------------------------


def test_autoencoder_kl_keeps_group_norm_when_its_decomposition_does_not_run(
    tmp_path: Path,
) -> None:
    pytest.importorskip("diffusers")
    result = export(tmp_path, "hf_vae.py")
    report = result.report
    assert result.succeeded, report.error
    warning = _warning(result, "decomposition_ops_kept")
    assert warning.details["ops"] == ["aten.group_norm.default"]
    assert warning.details["reason"] == "verification_failed"
    assert warning.details["failure"].startswith("the exported program raised: RuntimeError")
    assert "is_contiguous" in warning.details["failure"]
    assert report.decomposition is not None
    assert report.decomposition.kept_after_failure == ["aten.group_norm.default"]
    assert report.decomposition.ops_after["aten.group_norm.default"] > 0
    assert "aten.conv2d.default" not in report.decomposition.ops_after  # still decomposed
    assert report.verification is not None and report.verification.passed is True
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"


def test_autoencoder_kl_without_keep_failing_ops_says_the_program_raised(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    result = export(
        tmp_path,
        "hf_vae.py",
        {"decomposition": {"keep_failing_ops": False}, "verify": {"roundtrip": False}},
    )
    error = result.report.error
    assert error is not None and error.code == "verification_failed"
    assert error.message.startswith("The exported program raised on sample 'example': ")
    assert "is_contiguous" in error.message
    assert error.details["reason"].startswith("the exported program raised: RuntimeError")
    assert result.report.verification is not None
    (sample,) = result.report.verification.samples
    assert sample.status == "failed"
    assert (sample.reason or "").startswith("the exported program raised: ")


# --- 0/1 specialization ------------------------------------------------------------------


def _program(tmp_path: Path) -> torch.export.ExportedProgram:
    return torch.export.load(tmp_path / "out" / "program.pt2")


def _symbolic_batch(ep: torch.export.ExportedProgram, name: str) -> tuple[int, int | None]:
    """The range of the symbol of dim 0 of user input `name` (fails if it is a constant)."""
    node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == name)
    size = node.meta["val"].shape[0]
    assert isinstance(size, torch.SymInt), f"{name} dim 0 is the constant {size}"
    bounds = ep.range_constraints[size.node.expr]
    upper = int(bounds.upper) if isinstance(bounds.upper, sympy.Integer) else None  # None: oo
    return int(bounds.lower), upper


def test_a_batch_of_one_stays_dynamic_on_a_plain_module(tmp_path: Path) -> None:
    spec = {"x": {"0": {"name": "batch", "min": 1, "max": 8}}}
    result = export(tmp_path, "spec_batch_one.py", {"dynamic_shapes": spec})
    report = result.report
    assert result.succeeded, report.error
    warning = _warning(result, "specialization_avoided")
    assert warning.details["dims"] == [
        {"name": "batch", "positions": ["x.0"], "example_size": 1, "traced_size": 2}
    ]
    # one attempt, no "batch = 1" fix applied: the spec stayed as asked
    assert len(report.tracing.attempts) == 1 and report.tracing.dynamic_shapes.fixes == []
    assert report.model_dump(mode="json")["tracing"]["dynamic_shapes"]["applied"] == spec
    assert report.verification is not None
    samples = {s.label: s for s in report.verification.samples}
    assert samples["example"].input_shapes == {"args[0]": [1, 4]}  # the user's example
    assert samples["max"].status == "passed" and samples["max"].symbols
    assert list(samples["max"].symbols.values()) == [8]
    ep = _program(tmp_path)
    assert _symbolic_batch(ep, "x") == (1, 8)
    assert ep.module()(torch.randn(3, 4)).shape == (3, 4)


def test_no_widening_when_the_example_batch_is_not_one(tmp_path: Path) -> None:
    spec = {"x": {"0": {"name": "batch", "min": 1, "max": 8}}}
    result = export(
        tmp_path, "docs_bare_tensor.py", {"dynamic_shapes": spec, "verify": {"enabled": False}}
    )
    assert result.succeeded, result.report.error
    assert "specialization_avoided" not in [w.code for w in result.report.warnings]


def test_a_text_model_with_a_batch_of_one_stays_dynamic_after_decomposition(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    spec = {
        "input_ids": {"0": {"name": "batch", "min": 1, "max": 8}, "1": {"name": "seq", "max": 32}},
        "attention_mask": {"0": "batch", "1": "seq"},
    }
    result = export(tmp_path, "hf_llama.py", {"dynamic_shapes": spec})
    report = result.report
    assert result.succeeded, report.error
    dims = _warning(result, "specialization_avoided").details["dims"]
    assert dims == [
        {
            "name": "batch",
            "positions": ["input_ids.0", "attention_mask.0"],
            "example_size": 1,
            "traced_size": 2,
        }
    ]
    assert report.tracing.dynamic_shapes.fixes == []
    # core ATen (run_decompositions re-traces): batch still symbolic with its range
    assert report.decomposition is not None and report.decomposition.mode == "core_aten"
    ep = _program(tmp_path)
    assert _symbolic_batch(ep, "input_ids") == (1, 8)
    assert _symbolic_batch(ep, "attention_mask") == (1, 8)
    ids = torch.randint(0, 64, (3, 5))
    out = ep.module()(input_ids=ids, attention_mask=torch.ones(3, 5, dtype=torch.long))
    assert out["logits"].shape == (3, 5, 64)
    assert report.verification is not None
    samples = {s.label: s for s in report.verification.samples}
    assert samples["example"].input_shapes["kwargs['input_ids']"] == [1, 8]
    assert samples["max"].status == "passed"
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"


# --- KV caches ------------------------------------------------------------------------------

_TORCH_ONLY_LOAD = """
import sys, torch
ep = torch.export.load(sys.argv[1])
inputs = torch.load(sys.argv[2])
out = ep.module()(**inputs)
assert "transformers" not in sys.modules
layer = out["past_key_values"]["layers"][1]
print(type(out).__name__, tuple(out["logits"].shape), tuple(layer["keys"].shape))
"""


def _load_in_torch_only_process(tmp_path: Path, inputs: dict[str, Any]) -> str:
    torch.save(inputs, tmp_path / "inputs.pt")
    done = subprocess.run(
        [sys.executable, "-I", "-c", _TORCH_ONLY_LOAD, "program.pt2", str(tmp_path / "inputs.pt")],
        cwd=tmp_path / "out",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_dynamic_cache_output_becomes_plain_and_loads_with_torch_alone(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    result = export(tmp_path, "hf_llama_cache.py")
    report = result.report
    assert result.succeeded, report.error
    warning = _warning(result, "outputs_made_portable")
    assert warning.details["objects"] == [
        "transformers.cache_utils.DynamicCache",
        "transformers.cache_utils.DynamicLayer",
    ]
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    paths = signature["portability"]["leaf_paths"]
    assert paths["output['past_key_values']['layers'][1]['values']"] == (
        "output['past_key_values'].layers[1].values"
    )
    assert paths["output['logits']"] == "output['logits']"
    assert report.verification is not None and report.verification.passed is True
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    assert len(report.verification.roundtrip.outputs) == 5  # logits + 2 layers x keys/values
    ids = torch.randint(0, 64, (2, 8))
    line = _load_in_torch_only_process(
        tmp_path, {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    )
    assert line == "dict (2, 8, 64) (2, 1, 8, 8)"


def test_a_dynamic_cache_output_is_made_plain_without_verification(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    result = export(tmp_path, "hf_llama_cache.py", {"verify": {"enabled": False}})
    assert result.succeeded, result.report.error
    assert "objects" in _warning(result, "outputs_made_portable").details


def test_a_dynamic_cache_passed_in_is_rebuilt_by_the_program(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    result = export(tmp_path, "hf_llama_cache_input.py")
    report = result.report
    assert result.succeeded, report.error
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    paths = signature["portability"]["leaf_paths"]
    assert paths["kwargs['past_key_values']['layers'][0]['keys']"] == (
        "kwargs['past_key_values'].layers[0].keys"
    )
    assert report.verification is not None and report.verification.passed is True
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    cache = {
        "layers": [
            {"keys": torch.randn(2, 1, 8, 8), "values": torch.randn(2, 1, 8, 8)} for _ in range(2)
        ]
    }
    line = _load_in_torch_only_process(
        tmp_path,
        {
            "input_ids": torch.randint(0, 64, (2, 1)),
            "attention_mask": torch.ones(2, 9, dtype=torch.long),
            "past_key_values": cache,
        },
    )
    assert line == "dict (2, 1, 64) (2, 1, 9, 8)"  # the cache grew by the new position


# --- suggested dynamic shapes ---------------------------------------------------------------


def test_the_suggested_spec_of_a_text_model_exports_with_batch_and_seq_dynamic(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    first = export(tmp_path / "first", "hf_llama.py", {"verify": {"enabled": False}})
    assert first.succeeded, first.report.error
    dynamic = first.report.model_dump(mode="json")["tracing"]["dynamic_shapes"]
    assert dynamic["source"] == "none" and dynamic["applied"] is None
    suggested = dynamic["suggested"]
    assert suggested == {
        "input_ids": {"0": {"name": "batch", "min": 1}, "1": {"name": "seq", "min": 2}},
        "attention_mask": {"0": "batch", "1": "seq"},
    }
    # the suggestion is a spec the engine takes: batch (example 1) and seq stay dynamic
    second = export(
        tmp_path, "hf_llama.py", {"dynamic_shapes": suggested, "verify": {"roundtrip": False}}
    )
    assert second.succeeded, second.report.error
    assert second.report.tracing.dynamic_shapes.suggested is None  # only when none was given
    ep = _program(tmp_path)
    assert _symbolic_batch(ep, "input_ids") == (1, None)
    out = ep.module()(
        input_ids=torch.randint(0, 64, (3, 5)), attention_mask=torch.ones(3, 5, dtype=torch.long)
    )
    assert out["logits"].shape == (3, 5, 64)
