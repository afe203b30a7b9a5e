"""Verification in reduced precision (engine.verify.precision): a bfloat16 program is
judged against a float32 reference of the same weights, next to eager's own error."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.pipeline.steps import verification_failed
from engine.verify import precision
from engine.verify.precision import PRECISION_RATIO, float32_reference
from engine.verify.verification import verify
from schemas import VerifyOptions


class Accumulator(torch.nn.Module):
    """Sums 4096 products in bfloat16 running sums, as a long bfloat16 reduction rounds:
    the eager model of these tests."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(4096, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(x.shape[0], 1, dtype=x.dtype)
        for chunk in (x * self.weight).split(8, -1):
            total = total + chunk.sum(-1, keepdim=True)  # rounded to x.dtype each time
        return total


class WideSum(Accumulator):
    """The same sum as one float32 reduction (optionally off by `bias`): the program.
    It differs from `Accumulator` by more than bfloat16's tolerance."""

    def __init__(self, weight: torch.nn.Parameter, bias: float = 0.0) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x * self.weight).float().sum(-1, keepdim=True) + self.bias).to(x.dtype)


def _check(bias: float = 0.0, **options: float) -> tuple[bool | None, dict]:
    torch.manual_seed(0)
    eager = Accumulator()
    x = torch.rand(2, 4096, dtype=torch.bfloat16)
    ep = torch.export.export(WideSum(eager.weight, bias), (x,))
    report = verify(ep, eager, (x,), {}, VerifyOptions(samples=0, **options))
    output = report.samples[0].outputs[0]
    return report.passed, output.model_dump()


def test_a_bfloat16_program_no_worse_than_eager_passes_against_a_float32_reference() -> None:
    passed, output = _check()
    precision = output["precision"]
    assert precision is not None  # outside bfloat16's tolerance from eager
    assert output["max_abs_error"] > output["atol"]
    assert precision["exported_error"] < precision["eager_error"]
    assert precision["ratio"] == PRECISION_RATIO and precision["passed"] is True
    assert passed is True


def test_a_bfloat16_program_worse_than_eager_fails() -> None:
    passed, output = _check(bias=4096.0)
    precision = output["precision"]
    assert precision is not None and precision["passed"] is False
    assert precision["exported_error"] > PRECISION_RATIO * precision["eager_error"]
    assert passed is False


def test_explicit_tolerances_are_not_second_guessed() -> None:
    passed, output = _check(atol=1e-3)
    assert passed is False and output["precision"] is None


def test_the_float32_reference_leaves_the_weights_as_they_were() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)).bfloat16()
    model.register_buffer("cache", torch.zeros(4, dtype=torch.bfloat16))
    before = {name: (p.data_ptr(), p.dtype) for name, p in model.named_parameters()}
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    out = float32_reference(model, (x,), {})
    assert out.dtype == torch.float32
    assert {name: (p.data_ptr(), p.dtype) for name, p in model.named_parameters()} == before
    assert model.cache.dtype == torch.bfloat16
    wide = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
    wide.load_state_dict({k: v.float() for k, v in model.state_dict().items() if k != "cache"})
    assert torch.allclose(out, wide(x.float()), atol=1e-5)


def test_a_failure_only_in_reduced_precision_says_what_was_compared() -> None:
    torch.manual_seed(0)
    eager = Accumulator()
    x = torch.rand(2, 4096, dtype=torch.bfloat16)
    ep = torch.export.export(WideSum(eager.weight, bias=4096.0), (x,))
    report = verify(ep, eager, (x,), {}, VerifyOptions(samples=0))
    error = verification_failed(report, None)
    assert error.code == "verification_failed"
    assert error.details["dtype"] == "bfloat16" and error.details["sample"] == "example"
    judged = error.details["precision"]
    assert judged["reference"] == "float32" and judged["passed"] is False
    assert judged["exported_error"] > judged["ratio"] * judged["eager_error"]
    assert "undecomposed_passed" not in error.details


class CachedSum(Accumulator):
    """`Accumulator` that also keeps its result in a bfloat16 buffer (a cache's write)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("last", torch.zeros(2, 1, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = super().forward(x)
        self.last.copy_(total)
        return total


class WideCachedSum(WideSum):
    """`WideSum` that keeps its result in the same buffer, off by `bias` there only."""

    def __init__(self, weight: torch.nn.Parameter, bias: float = 0.0) -> None:
        super().__init__(weight)
        self.cache_bias = bias
        self.register_buffer("last", torch.zeros(2, 1, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = super().forward(x)
        self.last.copy_(total + self.cache_bias)
        return total


def _cached(bias: float) -> dict:
    torch.manual_seed(0)
    eager = CachedSum()
    x = torch.rand(2, 4096, dtype=torch.bfloat16)
    ep = torch.export.export(WideCachedSum(eager.weight, bias), (x,))
    report = verify(ep, eager, (x,), {}, VerifyOptions(samples=0))
    (buffer,) = report.samples[0].buffers
    assert buffer.path == "last"
    return {"passed": report.passed, **buffer.model_dump()}


def test_a_mutated_bfloat16_buffer_is_judged_against_the_float32_reference_too() -> None:
    good = _cached(0.0)
    assert good["max_abs_error"] > good["atol"]  # outside bfloat16's tolerance from eager
    assert good["precision"]["passed"] is True and good["passed"] is True
    assert good["precision"]["exported_error"] < good["precision"]["eager_error"]
    bad = _cached(4096.0)
    assert bad["precision"]["passed"] is False and bad["passed"] is False


def test_big_weights_are_widened_a_slice_at_a_time_to_the_same_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision, "CHUNK_BYTES", 1024)  # 4 rows of 64 float32s a slice
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(50, 64), torch.nn.Linear(64, 37), torch.nn.Linear(37, 50, bias=False)
    ).bfloat16()
    ids = torch.tensor([[1, 4, 9, 49]])
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    out = float32_reference(model, (ids,), {})
    wide = copy.deepcopy(model).float()
    assert out.dtype == torch.float32
    assert torch.allclose(out, wide(ids), atol=1e-5, rtol=1e-5)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before
    assert "forward" not in vars(model[1]) and "forward" not in vars(model[0])
