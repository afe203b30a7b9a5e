"""The VERIFY stage: exported vs eager on the example and inside the dynamic ranges."""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any

import pytest
import torch

from engine.verify.verification import compare_leaf, default_tolerance, verify
from schemas import VerifyOptions
from tests.engine.model_files import import_model_file as fixture


def exported(module: ModuleType) -> tuple[torch.export.ExportedProgram, torch.nn.Module]:
    pristine = copy.deepcopy(module.model)
    ep = torch.export.export(
        copy.deepcopy(module.model),
        module.example_args,
        getattr(module, "example_kwargs", {}),
        dynamic_shapes=getattr(module, "dynamic_shapes", None),
    )
    return ep, pristine


@pytest.fixture(scope="module")
def dynamic() -> tuple[ModuleType, torch.export.ExportedProgram, torch.nn.Module]:
    module = fixture("verify_dynamic")
    ep, pristine = exported(module)
    return module, ep, pristine


def run(
    module: ModuleType,
    ep: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    **options: Any,
) -> Any:
    return verify(
        ep,
        pristine,
        module.example_args,
        getattr(module, "example_kwargs", {}),
        VerifyOptions(**options),
    )


def test_example_and_samples_pass_with_labels_and_symbols(dynamic: Any) -> None:
    report = run(*dynamic, samples=4)
    assert report.enabled is True
    assert report.passed is True
    assert report.duration_s is not None and report.duration_s > 0
    assert [s.label for s in report.samples] == ["example", "min", "max", "random-1", "random-2"]
    assert all(s.status == "passed" for s in report.samples)
    example = report.samples[0]
    assert example.symbols == {}
    assert example.input_shapes == {"args[0]": [4, 4], "args[1]": [5, 4], "kwargs['mask']": [3]}
    assert [(o.path, o.shape, o.dtype) for o in example.outputs] == [
        ("['sum']", [4], "float32"),
        ("['masked']", [3], "float32"),
    ]
    assert all(o.max_abs_error is not None and o.max_abs_error <= 1e-5 for o in example.outputs)
    # each side's run is timed, per sample: where a slow verification spends its time
    assert all(s.eager_s is not None and s.eager_s > 0 for s in report.samples)
    assert all(s.exported_s is not None and s.exported_s > 0 for s in report.samples)


def test_samples_cover_min_max_and_honour_derived_dims(dynamic: Any) -> None:
    report = run(*dynamic, samples=4)
    by_label = {s.label: s for s in report.samples}
    # dimx is declared [3, 6]; the mask's dim has no max: capped at max(2*3, 2+8) = 10.
    assert sorted(by_label["min"].symbols.values()) == [2, 3]
    assert sorted(by_label["max"].symbols.values()) == [6, 10]
    for sample in report.samples[1:]:
        shapes = sample.input_shapes
        assert shapes["args[1]"][0] == shapes["args[0]"][0] + 1  # y is dimx + 1
        assert 3 <= shapes["args[0]"][0] <= 6
        assert 2 <= shapes["kwargs['mask']"][0] <= 10
    assert by_label["min"].input_shapes["args[0]"] == [3, 4]
    assert by_label["max"].input_shapes["args[1]"] == [7, 4]


def test_buffer_mutations_are_compared_and_never_leak_into_the_program(dynamic: Any) -> None:
    module, ep, pristine = dynamic
    before = ep.state_dict["calls"].clone()
    for program in (ep, ep.run_decompositions()):
        report = run(module, program, pristine, samples=2)
        assert report.passed is True
        for sample in report.samples:
            assert [b.path for b in sample.buffers] == ["calls"]
            assert sample.buffers[0].passed is True
    assert torch.equal(ep.state_dict["calls"], before)
    assert torch.equal(pristine.calls, torch.zeros(1))


def test_a_wrong_buffer_update_fails(dynamic: Any) -> None:
    module, ep, pristine = dynamic
    drifted = copy.deepcopy(pristine)
    drifted.calls.fill_(5.0)  # eager now counts from 5, the program from 0
    report = run(module, ep, drifted, samples=0)
    assert report.passed is False
    sample = report.samples[0]
    assert sample.status == "failed"
    assert sample.buffers[0].path == "calls"
    assert sample.buffers[0].max_abs_error == pytest.approx(5.0)


def test_sampling_is_deterministic_for_a_seed(dynamic: Any) -> None:
    module, ep, pristine = dynamic
    kwargs = module.example_kwargs
    first = verify(ep, pristine, module.example_args, kwargs, VerifyOptions(samples=6), seed=3)
    again = verify(ep, pristine, module.example_args, kwargs, VerifyOptions(samples=6), seed=3)
    assert [s.symbols for s in first.samples] == [s.symbols for s in again.samples]
    assert [[o.max_abs_error for o in s.outputs] for s in first.samples] == [
        [o.max_abs_error for o in s.outputs] for s in again.samples
    ]


def test_a_program_without_symbols_runs_only_the_example() -> None:
    ep, pristine = exported(fixture("verify_dataclass_output"))
    module = fixture("verify_dataclass_output")
    report = run(module, ep, pristine, samples=3)
    assert [s.label for s in report.samples] == ["example"]
    assert report.passed is True
    # The dataclass's leaves are compared, paths as the program returns them.
    assert [o.path for o in report.samples[0].outputs] == [
        ".value",
        ".scores.low",
        ".scores.high",
    ]


def test_a_sample_the_eager_model_rejects_is_skipped_not_failed() -> None:
    module = fixture("verify_gather")
    ep, pristine = exported(module)
    report = run(module, ep, pristine, samples=3)
    by_label = {s.label: s for s in report.samples}
    # The example index holds 7; at the minimum of 2 rows, eager indexing raises.
    assert by_label["min"].status == "skipped"
    assert by_label["min"].reason is not None
    assert by_label["min"].reason.startswith("eager run: IndexError")
    assert (by_label["min"].eager_s, by_label["min"].exported_s) == (None, None)
    assert by_label["max"].status == "passed"
    # No check failed (`passed` keeps that meaning), but it is not verified.
    assert report.passed is True
    assert report.verdict == "partially_verified"
    skipped = [s.label for s in report.samples if s.status == "skipped"]
    assert "min" in skipped
    assert report.skipped == len(skipped)
    assert report.checked == len(report.samples) - len(skipped) >= 2


def test_all_samples_passing_is_verified(dynamic: Any) -> None:
    report = run(*dynamic, samples=4)
    assert report.verdict == "verified"
    assert (report.checked, report.skipped) == (5, 0)


class Accumulate(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, total: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return x * 2


def test_inputs_changed_in_place_are_compared() -> None:
    args, kwargs = (torch.randn(3),), {"total": torch.zeros(3)}
    ep = torch.export.export(Accumulate(), args, kwargs)
    report = verify(ep, Accumulate(), args, kwargs, VerifyOptions(samples=0))
    assert report.passed is True
    assert [b.path for b in report.samples[0].buffers] == ["kwargs['total']"]
    assert report.samples[0].buffers[0].max_abs_error == 0.0
    assert torch.equal(kwargs["total"], torch.zeros(3))  # the caller's inputs are untouched


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * self.scale, (x > 0).sum()


def test_outputs_outside_tolerance_fail_with_the_errors() -> None:
    model = Scaled()
    x = torch.tensor([1.0, -2.0, 4.0])
    ep = torch.export.export(model, (x,))
    model.scale = 1.5  # a Python attribute the program baked in as 1.0
    report = verify(ep, model, (x,), {}, VerifyOptions(samples=0))
    assert report.passed is False
    assert (report.verdict, report.checked, report.skipped) == ("failed", 1, 0)
    values, count = report.samples[0].outputs
    assert values.passed is False
    assert values.max_abs_error == pytest.approx(2.0)  # |6.0 - 4.0|
    assert values.max_rel_error == pytest.approx(1 / 3)  # |e - a| / (|e| + 1e-7)
    assert (values.atol, values.rtol) == (1e-5, 1.3e-6)
    assert count.passed is True
    assert (count.dtype, count.atol, count.rtol) == ("int64", 0.0, 0.0)

    loose = verify(ep, model, (x,), {}, VerifyOptions(samples=0, atol=2.5, rtol=0.0))
    assert loose.passed is True


def test_disabled_verification_checks_nothing() -> None:
    model = Scaled()
    ep = torch.export.export(model, (torch.ones(2),))
    report = verify(ep, model, (torch.ones(2),), {}, VerifyOptions(enabled=False))
    assert report.enabled is False
    assert report.passed is None
    assert report.samples == []
    assert (report.verdict, report.checked, report.skipped) == ("disabled", 0, 0)


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [
        (torch.float32, (1e-5, 1.3e-6)),
        (torch.float64, (1e-5, 1.3e-6)),
        (torch.complex64, (1e-5, 1.3e-6)),
        (torch.float16, (1e-3, 1.6e-2)),
        (torch.bfloat16, (1e-3, 1.6e-2)),
        (torch.int32, (0.0, 0.0)),
        (torch.bool, (0.0, 0.0)),
    ],
)
def test_default_tolerances_by_dtype(dtype: torch.dtype, tolerance: tuple[float, float]) -> None:
    assert default_tolerance(dtype) == tolerance


def test_leaf_comparison_flags_shape_dtype_and_nan_differences() -> None:
    opts = VerifyOptions()
    nan = torch.tensor([1.0, float("nan")])
    assert compare_leaf("x", nan, nan.clone(), opts).passed is True
    assert compare_leaf("x", nan, torch.tensor([1.0, 2.0]), opts).passed is False
    assert compare_leaf("x", torch.ones(2), torch.ones(3), opts).passed is False
    assert (
        compare_leaf("x", torch.ones(2), torch.ones(2, dtype=torch.float64), opts).passed is False
    )
    assert compare_leaf("n", 3, 3, opts).passed is True
    assert compare_leaf("n", 3, 4, opts).passed is False
    assert compare_leaf("x", torch.ones(2), 1.0, opts).passed is False


def test_a_program_that_raises_says_so_instead_of_comparing_outputs() -> None:
    model = torch.nn.Linear(4, 3)
    ep = torch.export.export(model, (torch.randn(2, 4),))  # static batch of 2
    # batch 3: eager runs, the program refuses it with its own shape check
    report = verify(ep, copy.deepcopy(model), (torch.randn(3, 4),), {}, VerifyOptions())
    assert report.passed is False
    (sample,) = report.samples
    assert sample.status == "failed" and sample.outputs == []
    assert sample.reason is not None
    assert sample.reason.startswith("the exported program raised: ")
    assert "Error" in sample.reason.split(": ")[1]
