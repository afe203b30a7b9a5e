"""A target whose runtime refuses inputs the program accepts (engine.targets.failures):
the runtime's own message in the error, the bound it met and the largest size that fits
it in the hint, and option `target_range: "verified"` keeping the target for the range it
ran.

ExecuTorch refused batches over 15 of a model declared for more (issue 34: `Attempted to
resize a bounded tensor with a maximum capacity of 15360 elements … to 51200`, an upstream
bound); the mapping is tested on that exact message, and the runtime's refusal itself on
a `.pte` planned for a smaller batch than the program it is verified against.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from engine import targets
from engine.targets import executorch, failures
from engine.verify import verification
from schemas import ExportOptions, SampleCheck, VerificationReport

UPSTREAM = (
    "RuntimeError: method->set_inputs() for method 'forward' failed with error 0x10 (the "
    "runtime: [tensor_impl.cpp:156] Attempted to resize a bounded tensor with a maximum "
    "capacity of 15360 elements to 51200 elements. [method.cpp:1240] Error resizing tensor "
    "at input 0)"
)
"""What the ExecuTorch runner's error reads like for crepe's batch 50, its log appended."""


def _sample(label: str, batch: int, refused: bool = False) -> SampleCheck:
    return SampleCheck(
        label=label,
        symbols={"batch": batch},
        input_shapes={"audio": [batch, 1024]},
        status="failed" if refused else "passed",
        reason=verification.EXPORTED_RAISED + UPSTREAM if refused else None,
    )


def _check(*samples: SampleCheck) -> VerificationReport:
    return VerificationReport(
        enabled=True, passed=all(s.status == "passed" for s in samples), samples=list(samples)
    )


CREPE = _check(_sample("example", 4), _sample("min", 1), _sample("random-0", 50, refused=True))


def test_a_refusal_names_the_runtime_message_the_bound_and_what_fits_it() -> None:
    raised, where = failures.first_failure(CREPE)
    assert raised
    error = failures.refusal("executorch", "model.pte", CREPE, where, executorch.bound)
    # The runtime's own lines are in the message, not only its error number.
    assert UPSTREAM.removeprefix("RuntimeError: ") in error.message
    details = error.details
    assert details["reason"] == "runtime_refused"
    assert details["runtime_message"] == UPSTREAM
    assert (details["capacity"], details["requested"], details["input_index"]) == (15360, 51200, 0)
    assert (details["input"], details["dim"], details["largest_fit"]) == ("audio", 0, 15)
    assert details["verified_range"] == {"audio": {"0": [1, 4]}}
    assert error.hint is not None
    assert "15360" in error.hint and "up to 15" in error.hint
    assert "target_range" in error.hint  # the option that keeps it, and its range
    assert "audio dim 0: 1…4" in error.hint


def test_a_refused_target_is_kept_for_the_range_it_ran() -> None:
    kept = failures.narrowed(CREPE, "executorch")
    assert kept is not None
    check, ran = kept
    assert ran == {"audio": {"0": [1, 4]}}
    assert (check.verdict, check.passed, check.checked, check.skipped) == (
        "partially_verified",
        True,
        2,
        1,
    )
    refused = check.samples[-1]
    assert (refused.status, refused.bound) == ("skipped", failures.RUNTIME_BOUND)


@pytest.mark.parametrize(
    "samples",
    [
        # a refused sample inside the range that passed: no honest range to claim
        (_sample("min", 1), _sample("random-0", 50, refused=True), _sample("max", 64)),
        # nothing passed
        (_sample("random-0", 50, refused=True),),
    ],
)
def test_no_range_is_claimed_that_the_samples_do_not_bear_out(
    samples: tuple[SampleCheck, ...],
) -> None:
    assert failures.narrowed(_check(*samples), "executorch") is None


def test_bound_reads_the_runtime_message() -> None:
    assert executorch.bound(UPSTREAM) == {
        "capacity": 15360,
        "requested": 51200,
        "input_index": 0,
    }
    assert executorch.bound("error 0x10") is None


# --- the runtime itself ----------------------------------------------------------------


def _narrower_pte(tmp_path: Path, **options: object) -> object:
    """A `.pte` planned for batch ≤ 4 (lowered from a program exported so), verified on
    the samples of the same model exported for batch ≤ 16."""
    pytest.importorskip("executorch", reason="executorch is not installed (docs/targets.md)")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3).eval()
    args = (torch.randn(2, 8),)
    planned = torch.export.export(model, args, dynamic_shapes=({0: Dim("b", min=1, max=4)},))
    wider = torch.export.export(model, args, dynamic_shapes=({0: Dim("b", min=1, max=16)},))
    return targets.run_target(
        "executorch",
        targets.TargetJob(
            program=wider.run_decompositions(),
            traced=planned,
            pristine=model,
            args=args,
            kwargs={},
            out_dir=tmp_path,
            options=ExportOptions.model_validate({"verify": {"samples": 4}, **options}),
            names={},
        ),
    )


def test_the_runtime_refusal_is_target_failed_with_its_own_message(tmp_path: Path) -> None:
    result = _narrower_pte(tmp_path)
    assert result.status == "failed" and result.error is not None  # type: ignore[attr-defined]
    error = result.error  # type: ignore[attr-defined]
    assert error.code == "target_failed"
    details = error.details
    assert details["reason"] == "runtime_refused"
    # Captured from the runtime's log (fd 2): the plan holds 4 rows of 8 floats.
    assert details["capacity"] == 32, details
    assert details["largest_fit"] == 4
    assert details["requested"] % 8 == 0 and details["requested"] > 32
    assert "maximum capacity of 32 elements" in details["runtime_message"]
    assert not (tmp_path / "model.pte").exists()


def test_target_range_verified_keeps_the_pte_for_the_range_it_ran(tmp_path: Path) -> None:
    result = _narrower_pte(tmp_path, target_range="verified")
    assert result.status == "succeeded", result.error  # type: ignore[attr-defined]
    assert (tmp_path / "model.pte").is_file()
    check = result.verification  # type: ignore[attr-defined]
    assert check is not None and check.verdict == "partially_verified"
    refused = [s for s in check.samples if s.status == "skipped"]
    assert refused and all(s.bound == failures.RUNTIME_BOUND for s in refused)
    ranges = result.details["verified_range"]  # type: ignore[attr-defined]
    assert list(ranges) == ["args[0]"] and list(ranges["args[0]"]) == ["0"]
    low, high = ranges["args[0]"]["0"]
    assert low == 1 and 2 <= high <= 4  # the example (2), the min (1), what else fit
    assert all(s.input_shapes["args[0]"][0] > high for s in refused)
