"""Weights a user actually has (issue 34, item 5): `.pth` files, a training checkpoint's
state dict under a conventional key (or the key option `weights.key` names), and option
`weights.strict: false`, which loads what matches and reports the names it skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.errors import ExportError, InvalidInputs, WeightsMismatch
from engine.load.loading import load
from engine.load.model import LoadedModel, Upload
from schemas import ExportOptions

MODELS = Path(__file__).parents[1] / "models"


def _state() -> dict[str, torch.Tensor]:
    return {
        "linear.weight": torch.full((2, 3), 0.5),
        "linear.bias": torch.full((2,), -1.0),
        "offset": torch.full((2,), 3.0),
    }


def _load(tmp_path: Path, saved: Any, name: str = "w.pth", **options: Any) -> LoadedModel:
    weights = tmp_path / name
    torch.save(saved, weights)
    return load(
        Upload(model=MODELS / "load_instance.py", weights=weights),
        ExportOptions.model_validate(options),
        tmp_path / "work",
    )


def _refused(error: type[ExportError], tmp_path: Path, saved: Any, **options: Any) -> ExportError:
    with pytest.raises(error) as info:
        _load(tmp_path, saved, **options)
    assert info.value.stage == "loading"
    return info.value


def test_a_pth_state_dict_is_loaded_and_reported(tmp_path: Path) -> None:
    loaded = _load(tmp_path, _state())
    assert torch.equal(loaded.module.offset, torch.full((2,), 3.0))
    report = loaded.weights
    assert report is not None
    assert (report.file, report.format, report.key, report.strict) == ("w.pth", "pt", None, True)
    assert (report.tensors, report.loaded) == (3, 3)
    assert (report.missing, report.unexpected) == ([], [])
    assert loaded.warnings == []


@pytest.mark.parametrize("key", ["model_state", "model_state_dict", "state_dict", "model"])
def test_a_training_checkpoint_is_read_under_its_conventional_key(tmp_path: Path, key: str) -> None:
    linear = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(linear.parameters())
    linear(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    checkpoint = {key: _state(), "optimizer_state": optimizer.state_dict(), "step": 12}
    loaded = _load(tmp_path, checkpoint)
    assert torch.equal(loaded.module.linear.bias, torch.full((2,), -1.0))
    assert loaded.weights is not None and loaded.weights.key == key


def test_another_key_is_named_in_the_refusal_and_taken_when_the_option_names_it(
    tmp_path: Path,
) -> None:
    checkpoint = {"ema_weights": _state(), "step": 12}
    error = _refused(InvalidInputs, tmp_path, checkpoint)
    assert error.details["candidates"] == ["ema_weights"]
    assert "ema_weights" in (error.hint or "")
    loaded = _load(tmp_path, checkpoint, weights={"key": "ema_weights"})
    assert torch.equal(loaded.module.offset, torch.full((2,), 3.0))
    assert loaded.weights is not None and loaded.weights.key == "ema_weights"


def test_a_key_the_file_lacks_is_refused(tmp_path: Path) -> None:
    error = _refused(InvalidInputs, tmp_path, {"model": _state()}, weights={"key": "ema"})
    assert error.details["reason"] == "key_not_found"
    assert (error.details["key"], error.details["candidates"]) == ("ema", ["model"])


def test_non_strict_loads_what_matches_and_names_what_it_skipped(tmp_path: Path) -> None:
    state = _state()
    del state["offset"]
    state["head.weight"] = torch.zeros(1)
    loaded = _load(tmp_path, {"model_state": state}, weights={"strict": False})
    assert torch.equal(loaded.module.linear.weight, torch.full((2, 3), 0.5))
    report = loaded.weights
    assert report is not None and report.strict is False
    assert (report.tensors, report.loaded) == (3, 2)
    assert (report.missing, report.missing_count) == (["offset"], 1)
    assert (report.unexpected, report.unexpected_count) == (["head.weight"], 1)
    [warning] = loaded.warnings
    assert warning.code == "weights_skipped"
    assert warning.details["missing"] == ["offset"]
    assert warning.details["unexpected"] == ["head.weight"]


def test_non_strict_still_refuses_weights_of_which_nothing_matches(tmp_path: Path) -> None:
    state = {f"module.{name}": tensor for name, tensor in _state().items()}
    error = _refused(WeightsMismatch, tmp_path, state, weights={"strict": False})
    assert error.details["matched"] == 0
    assert error.details["prefix"] == "module."


def test_a_prefix_that_would_make_the_names_match_is_named(tmp_path: Path) -> None:
    state = {f"model.{name}": tensor for name, tensor in _state().items()}
    error = _refused(WeightsMismatch, tmp_path, state)
    assert error.details["prefix"] == "model."
    assert sorted(error.details["unexpected"]) == sorted(state)
    assert "model." in (error.hint or "")


def test_shapes_that_differ_are_refused_even_when_not_strict(tmp_path: Path) -> None:
    state = _state()
    state["linear.weight"] = torch.zeros(4, 3)
    error = _refused(WeightsMismatch, tmp_path, state, weights={"strict": False})
    assert error.details["shape_mismatch"] == [
        {"key": "linear.weight", "expected": [2, 3], "got": [4, 3]}
    ]
