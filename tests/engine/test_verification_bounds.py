"""Verification's cost bound: samples too big for `verify.max_sample_cost` or for the job's
`memory_mb` are skipped, and the verdict then says partially verified."""

from __future__ import annotations

import pytest
import torch

from engine.pipeline.steps import partial_verification_warning
from engine.profile import resident_memory
from engine.verify.verification import MEMORY_SHARE, verify
from schemas import VerifyOptions

MB = 2**20


class Wide(torch.nn.Module):
    """Holds 20 MB of activations per row of its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones(x.shape[0], 5 * MB).mul(x[:, :1]).sum(1)


def _program() -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1, max=64)
    return torch.export.export(Wide(), (torch.ones(2, 3),), dynamic_shapes=({0: batch},))


@pytest.fixture(scope="module")
def program() -> torch.export.ExportedProgram:
    return _program()


def test_samples_over_max_sample_cost_are_skipped_with_their_cost(
    program: torch.export.ExportedProgram,
) -> None:
    opts = VerifyOptions(samples=2, max_sample_cost=4)
    report = verify(program, Wide(), (torch.ones(2, 3),), {}, opts)
    by_label = {s.label: s for s in report.samples}
    assert by_label["max"].status == "skipped"
    assert by_label["max"].bound == "max_sample_cost"
    assert by_label["max"].cost == 32.0
    assert by_label["min"].status == "passed" and by_label["min"].bound is None
    assert report.verdict == "partially_verified" and report.passed is True
    warning = partial_verification_warning(report)
    assert warning is not None and warning.code == "partially_verified"
    assert [s["bound"] for s in warning.details["samples"]] == ["max_sample_cost"]


def test_samples_whose_estimated_peak_exceeds_memory_mb_are_skipped(
    program: torch.export.ExportedProgram,
) -> None:
    now = resident_memory.resident()
    assert now is not None
    # MEMORY_SHARE of it is a few MB above the resident memory now: no room for the 64
    # rows of `max` (20 MB each), while `min` costs less than the example and always runs
    memory_mb = int((now / MB + 8) / MEMORY_SHARE)
    report = verify(
        program, Wide(), (torch.ones(2, 3),), {}, VerifyOptions(samples=2), memory_mb=memory_mb
    )
    by_label = {s.label: s for s in report.samples}
    assert by_label["max"].status == "skipped" and by_label["max"].bound == "memory_mb"
    assert by_label["max"].cost == 32.0
    assert by_label["min"].status == "passed"
    assert report.verdict == "partially_verified"
    roomy = verify(
        program, Wide(), (torch.ones(2, 3),), {}, VerifyOptions(samples=2), memory_mb=10**6
    )
    assert roomy.verdict == "verified"


def test_without_a_bound_every_sample_runs(program: torch.export.ExportedProgram) -> None:
    report = verify(program, Wide(), (torch.ones(2, 3),), {}, VerifyOptions(samples=2))
    assert [s.status for s in report.samples] == ["passed", "passed", "passed"]
    assert report.verdict == "verified"


def test_the_bound_is_an_option_above_zero_null_by_default() -> None:
    from pydantic import ValidationError

    from schemas import ExportOptions

    assert ExportOptions().verify.max_sample_cost is None
    assert (
        ExportOptions.model_validate({"verify": {"max_sample_cost": 8}}).verify.max_sample_cost == 8
    )
    with pytest.raises(ValidationError):
        ExportOptions.model_validate({"verify": {"max_sample_cost": 0}})
