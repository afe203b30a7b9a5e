"""A model left in training mode (issue 34, item 1): exported in eval mode with warning
`model_in_training_mode` by default, kept in training mode or refused as option
`training` asks, and never verified training-mode program against training-mode eager."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.errors import InvalidRequest
from engine.load import training_mode
from schemas import ReportWarning
from tests.engine.model_files import export_file, import_model_file

BATCH_NORM_TRAINING = "aten._native_batch_norm_legit_functional.default"


def _warning(warnings: list[ReportWarning]) -> ReportWarning:
    found = [w for w in warnings if w.code == "model_in_training_mode"]
    assert len(found) == 1, [w.code for w in warnings]
    return found[0]


def test_a_cnn_left_in_training_mode_is_exported_as_its_eval_model(tmp_path: Path) -> None:
    result = export_file(tmp_path, "train_mode_cnn.py")
    assert result.succeeded, result.report.error
    warning = _warning(result.report.warnings)
    assert warning.details["exported_in"] == "eval"
    assert warning.details["count"] == 4
    assert [(m["path"], m["type"], m["kind"]) for m in warning.details["modules"]] == [
        ("features.2", "BatchNorm1d", "batch_norm"),
        ("features.4", "Dropout", "dropout"),
        ("features.7", "BatchNorm1d", "batch_norm"),
        ("features.9", "Dropout", "dropout"),
    ]
    decomposition = result.report.decomposition
    assert decomposition is not None and BATCH_NORM_TRAINING not in decomposition.ops_after
    verification = result.report.verification
    assert verification is not None and verification.verdict == "verified"

    # The program answers what the eval model answers on a batch of one frame, far from
    # what the model in training mode (batch statistics) answers.
    fixture = import_model_file("train_mode_cnn")
    (frame,) = fixture.example_args
    program = torch.export.load(tmp_path / "out" / "program.pt2").module()
    evaluated = copy.deepcopy(fixture.model).eval()
    training = copy.deepcopy(fixture.model).train()
    with torch.no_grad():
        exported, expected, in_training = program(frame), evaluated(frame), training(frame)
    torch.testing.assert_close(exported, expected, rtol=1e-5, atol=1e-6)
    assert (in_training - expected).abs().max().item() > 0.1


def test_the_training_option_keeps_training_mode_when_asked(tmp_path: Path) -> None:
    # Dropout in training mode draws random masks: eager and program cannot be compared.
    options = {"training": "preserve", "verify": {"enabled": False}}
    result = export_file(tmp_path, "train_mode_cnn.py", options)
    assert result.succeeded, result.report.error
    assert _warning(result.report.warnings).details["exported_in"] == "training"
    decomposition = result.report.decomposition
    assert decomposition is not None and decomposition.ops_after[BATCH_NORM_TRAINING] == 2


def test_the_training_option_refuses_a_model_in_training_mode_when_asked(tmp_path: Path) -> None:
    result = export_file(tmp_path, "train_mode_cnn.py", {"training": "refuse"})
    error = result.report.error
    assert error is not None
    assert (error.code, error.stage) == ("invalid_request", "loading")
    assert error.details["reason"] == "training_mode"
    assert error.details["count"] == 4
    assert error.details["modules"][0]["path"] == "features.2"
    assert error.hint


class ReadsTraining(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.training else x


@pytest.mark.parametrize(
    ("module", "kinds"),
    [
        (nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.LayerNorm(2)), []),
        (nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)), []),
        (nn.BatchNorm1d(2, track_running_stats=False), []),
        (nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)), ["dropout"]),
        (nn.Sequential(nn.InstanceNorm1d(2, track_running_stats=True)), ["instance_norm"]),
        (nn.LSTM(2, 2, num_layers=2, dropout=0.1), ["dropout"]),
        (nn.Sequential(nn.RReLU()), ["rrelu"]),
        (nn.Sequential(ReadsTraining()), ["reads_training"]),
    ],
)
def test_only_layers_whose_behaviour_depends_on_the_mode_are_named(
    module: nn.Module, kinds: list[str]
) -> None:
    warning = training_mode.apply(module, "eval")
    assert not any(m.training for m in module.modules())
    named = [] if warning is None else [m["kind"] for m in warning.details["modules"]]
    assert named == kinds


def test_a_model_already_in_eval_mode_is_left_alone_whatever_the_option() -> None:
    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Dropout(0.5)).eval()
    for option in ("eval", "preserve", "refuse"):
        assert training_mode.apply(module, option) is None
        assert not module.training


def test_refusing_names_the_modules_in_training_mode() -> None:
    module = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    with pytest.raises(InvalidRequest) as info:
        training_mode.apply(module, "refuse")
    assert info.value.details["modules"] == [{"path": "1", "type": "Dropout", "kind": "dropout"}]
    assert module.training  # refused, not changed
