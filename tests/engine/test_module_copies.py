"""`engine.load.module_copies` and the runs that use it: the weights exist once, whatever runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.diagnostics.source_map import SourceMap
from engine.errors import EagerRunFailed
from engine.load import module_copies
from engine.load.eager import run_eager
from engine.verify.verification import WEIGHTS_CHANGED, verify
from schemas import VerifyOptions


class Counting(torch.nn.Module):
    """A linear layer with a buffer each run writes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.linear(x) + self.calls


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class WritesWeights(Scale):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.weight.mul_(2)
        return x * self.weight


def test_a_copy_shares_the_parameters_and_owns_the_buffers() -> None:
    model = Counting()
    copied = module_copies.sharing_weights(model)
    assert copied.linear.weight is model.linear.weight
    assert copied.calls.data_ptr() != model.calls.data_ptr()
    with torch.no_grad():
        copied(torch.ones(2, 8))
    assert float(model.calls) == 0.0 and float(copied.calls) == 1.0


def test_versions_tell_a_parameter_written_in_place() -> None:
    model = Counting()
    versions = module_copies.WeightVersions(model)
    with torch.no_grad():
        model(torch.ones(2, 8))  # writes a buffer only
    assert versions.changed() == []
    with torch.no_grad():
        model.linear.bias.add_(1)
    assert versions.changed() == ["linear.bias"]


def test_an_exported_program_that_keeps_its_weights_says_so() -> None:
    ep = torch.export.export(Counting(), (torch.ones(2, 8),))
    assert module_copies.mutates_parameters(ep) is False


def test_verification_never_copies_the_weights_and_leaves_them_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Counting().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(
        module_copies.sharing_weights(model), (torch.ones(2, 8),), dynamic_shapes=({0: batch},)
    )
    weight = model.linear.weight
    pointers = {weight.data_ptr()}
    original = module_copies.sharing_weights

    def watched(module: torch.nn.Module) -> torch.nn.Module:
        copied = original(module)
        pointers.update(p.data_ptr() for n, p in copied.named_parameters() if "weight" in n)
        return copied

    monkeypatch.setattr(module_copies, "sharing_weights", watched)
    outputs: list[object] = []
    report = verify(
        ep, model, (torch.ones(2, 8),), {}, VerifyOptions(samples=2), example_outputs=outputs
    )
    assert report.verdict == "verified"
    assert pointers == {weight.data_ptr()}  # eager and exported runs: the same tensor
    assert float(model.calls) == 0.0
    assert len(outputs) == 1 and torch.equal(outputs[0], model.linear(torch.ones(2, 8)) + 1)


def test_an_eager_forward_writing_its_weights_fails_the_sample() -> None:
    model = WritesWeights()
    ep = torch.export.export(Scale(), (torch.ones(4),))  # what export saw keeps its weights
    report = verify(ep, model, (torch.ones(4),), {}, VerifyOptions(samples=0))
    assert report.verdict == "failed"
    assert report.samples[0].reason is not None
    assert report.samples[0].reason.startswith(WEIGHTS_CHANGED)


def test_the_eager_reference_run_refuses_a_forward_writing_its_weights(tmp_path: Path) -> None:
    with pytest.raises(EagerRunFailed) as raised:
        run_eager(WritesWeights(), (torch.ones(4),), {}, SourceMap(tmp_path))
    assert raised.value.code == "eager_run_failed"
    assert raised.value.details["reason"] == "weights_changed"
    assert raised.value.details["parameters"] == ["weight"]
