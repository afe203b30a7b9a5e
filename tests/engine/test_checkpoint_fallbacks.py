"""What torchport chooses for a checkpoint is its own responsibility, not the user's: dims
the model's code does not allow fall back to static ones with warning `dims_made_static`
(`engine.trace.tracing`), and a text-generation model transformers cannot give a static
cache exports its plain forward with warning `generation_not_ready`
(`engine.load.checkpoint.building`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.trace.tracing import _narrowed
from tests.engine.test_checkpoints import dims, export, zip_directory

transformers = pytest.importorskip("transformers")

VERIFY = {"decomposition": {"mode": "none"}, "verify": {"samples": 2, "roundtrip": False}}


def _saved(directory: Path, model_class: str, config: Any) -> Path:
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).eval().save_pretrained(directory)
    return zip_directory(directory, directory.with_suffix(".zip"))


def _pvt(tmp_path: Path) -> Path:
    config = transformers.PvtV2Config(
        hidden_sizes=[8, 16, 24, 32],
        num_attention_heads=[1, 1, 1, 1],
        depths=[1, 1, 1, 1],
        mlp_ratios=[2, 2, 2, 2],
        num_labels=3,
    )
    return _saved(tmp_path / "pvt", "PvtV2ForImageClassification", config)


def _warning(result: Any, code: str) -> Any:
    found = [w for w in result.report.warnings if w.code == code]
    assert len(found) == 1, result.report.warnings
    return found[0]


def test_spatial_dims_the_model_refuses_fall_back_to_static_with_a_warning(
    tmp_path: Path,
) -> None:
    result = export(tmp_path, _pvt(tmp_path), VERIFY)
    assert result.succeeded, result.report.error
    warning = _warning(result, "dims_made_static")
    assert warning.details == {
        "dims": ["height", "width"],
        "source": "checkpoint",
        "reason": "dynamic_shape_violation",
    }
    assert dims(result) == {"pixel_values": {"0": {"name": "batch_size", "min": 1, "max": 64}}}
    requested = json.loads(result.report.tracing.dynamic_shapes.model_dump_json())["requested"]
    assert set(requested["pixel_values"]) == {"0", "2", "3"}  # what torchport asked first
    assert result.report.verification is not None and result.report.verification.passed
    attempts = result.report.tracing.attempts
    assert attempts[-1].succeeded and not any(a.succeeded for a in attempts[:-1])


def dims_of(spec: Any) -> dict[str, Any]:
    return (
        spec["pixel_values"].model_dump(exclude_none=True)
        if hasattr(spec["pixel_values"], "model_dump")
        else dict(spec["pixel_values"])
    )


@pytest.mark.slow
@pytest.mark.timeout(900)  # torch's export of PVT-v2 with a refused range: ~3 min on 2 cores
def test_the_users_own_dims_that_the_model_refuses_still_fail(tmp_path: Path) -> None:
    spec = {"pixel_values": {"2": {"name": "h", "min": 32, "max": 512}}}
    options = {**VERIFY, "dynamic_shapes": spec, "auto_fix_dynamic_shapes": False}
    result = export(tmp_path, _pvt(tmp_path), options)
    assert not result.succeeded
    assert result.report.error is not None
    assert result.report.error.code == "dynamic_shape_violation"


def test_a_suggested_fix_that_pins_a_chosen_dim_warns(tmp_path: Path) -> None:
    config = transformers.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=3)
    archive = _saved(tmp_path / "mobilenet", "MobileNetV2ForImageClassification", config)
    result = export(tmp_path, archive, VERIFY)
    assert result.succeeded, result.report.error
    warning = _warning(result, "dims_made_static")
    assert warning.details == {
        "dims": ["height", "width"],
        "source": "checkpoint",
        "reason": "suggested_fix",
    }
    assert dims(result)["pixel_values"]["2"] == 32


def test_narrowing_keeps_the_named_dims_and_drops_the_rest() -> None:
    spec = {
        "input_ids": {"0": {"name": "batch_size", "max": 64}, "1": {"name": "seq", "max": 9}},
        "mask": {"0": "batch_size", "1": "seq"},
        "pos": {"1": "seq+1"},
    }
    narrowed, dropped = _narrowed(spec, frozenset({"batch_size"}))
    assert narrowed == {
        "input_ids": {"0": {"name": "batch_size", "max": 64}},
        "mask": {"0": "batch_size"},
    }
    assert dropped == ["seq"]
    assert _narrowed(spec, frozenset()) == (None, ["batch_size", "seq"])


def _mamba(tmp_path: Path) -> Path:
    config = transformers.MambaConfig(
        vocab_size=64,
        hidden_size=16,
        state_size=4,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        time_step_rank=4,
    )
    return _saved(tmp_path / "mamba", "MambaForCausalLM", config)


def test_a_state_space_llm_exports_its_plain_forward_with_a_warning(tmp_path: Path) -> None:
    result = export(tmp_path, _mamba(tmp_path), VERIFY)
    assert result.succeeded, result.report.error
    report = result.report
    warning = _warning(result, "generation_not_ready")
    assert warning.details["reason"] == "no_static_cache"
    assert warning.details["model_type"] == "mamba"
    assert report.checkpoint is not None and report.checkpoint.task == "text-generation"
    assert report.generation is None  # not generation-ready: no generation check claimed
    assert report.verification is not None and report.verification.passed
    signature = json.loads(result.artifacts["signature.json"].read_text())
    assert [o["pytree_path"] for o in signature["outputs"]] == ["['logits']"]  # no cache


def test_asking_for_the_cache_by_name_still_fails(tmp_path: Path) -> None:
    options = {**VERIFY, "generation": {"cache": True}}
    result = export(tmp_path, _mamba(tmp_path), options)
    assert not result.succeeded
    assert result.report.error is not None
    assert result.report.error.code == "model_not_found"
    assert result.report.error.details["reason"] == "no_static_cache"


def test_a_limit_of_transformers_code_is_not_the_users_code_to_fix(tmp_path: Path) -> None:
    """LED's sliding-window attention branches on tensor values: `data_dependent`, with a
    hint for code the user did not write (not "add torch._check to your code")."""
    config = transformers.LEDConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_encoder_position_embeddings=64,
        max_decoder_position_embeddings=64,
        attention_window=[4],
    )
    archive = _saved(tmp_path / "led", "LEDForConditionalGeneration", config)
    options = {"verify": {"enabled": False}, "draft_report": False, "generation": {"cache": False}}
    result = export(tmp_path, archive, options)
    error = result.report.error
    assert error is not None and error.code == "data_dependent"
    assert error.details["library_code"] is True
    assert "torch._check" not in (error.hint or "")


def test_a_model_refusing_torchports_own_inputs_says_they_were_torchports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.load.checkpoint import building
    from engine.load.checkpoint.example_inputs import TaskInputs, task_inputs
    from tests.engine.test_checkpoints import bert

    def out_of_vocabulary(task: str, model: Any, config: Any) -> TaskInputs:
        made = task_inputs(task, model, config)
        return TaskInputs(
            {**made.kwargs, "input_ids": made.kwargs["input_ids"] + 1000}, made.dynamic_shapes
        )

    monkeypatch.setattr(building, "task_inputs", out_of_vocabulary)
    archive = zip_directory(bert(tmp_path), tmp_path / "bert.zip")
    result = export(tmp_path, archive, VERIFY)
    error = result.report.error
    assert error is not None and error.code == "eager_run_failed"
    assert error.details["inputs"] == "generated"
    assert error.details["task"] == "fill-mask"
    assert "--inputs" in (error.hint or "")
