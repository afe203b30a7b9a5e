"""A quantized artifact against the float eager model, on the verification samples.

Per output over the samples: the largest and the mean abs error, the lowest cosine
similarity (each sample's output flattened), and for a classification-shaped output
(2-D, or a path naming `logits`) the share of rows whose arg max agrees. The budget
(`quantize.min_cosine`, or `quantize.max_abs` when set) decides each output's `passed`,
so the artifact's verification report is within the budget or not, rather than within
float32's tolerances.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.load import module_copies
from engine.shapes.sampling import draw_samples, draw_values
from engine.verify.flat import flatten_with_paths
from engine.verify.precision import float32_reference, reduced_model
from engine.verify.verification import EXPORTED_RAISED, WEIGHTS_CHANGED, compare_leaf
from schemas import GenerationCheck, OutputCheck, SampleCheck, VerificationReport, VerifyOptions
from schemas.options import QuantizeOptions
from schemas.quantization import (
    GeneratedTokens,
    QuantizationReport,
    QuantizedOutput,
    QuantizedTarget,
)

__all__ = ["CHECKED_SAMPLES", "agrees", "measure", "record_tokens", "within"]

Runner = Callable[[tuple[Any, ...], dict[str, Any]], Any]

CHECKED_SAMPLES = 4
"""Calibration samples static `int8` checks itself on before it tries a fallback."""


def within(options: QuantizeOptions, cosine: float | None, max_abs: float | None) -> bool:
    """Whether an output's cosine or largest abs error is within the budget."""
    if options.max_abs is not None:
        return max_abs is not None and max_abs <= options.max_abs
    return cosine is not None and cosine >= options.min_cosine


def agrees(options: QuantizeOptions, expected: Any, actual: Any) -> bool:
    """Whether every floating output of `actual` (tensors or NumPy arrays, any pytree) is
    within the budget against the one of `expected` at the same position."""
    pairs = zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual), strict=False)
    for e, a in pairs:
        e, a = torch.as_tensor(e), torch.as_tensor(a)
        if not e.is_floating_point() or e.shape != a.shape:
            continue
        e, a = e.detach().double().flatten(), a.detach().double().flatten()
        max_abs = float((e - a).abs().max()) if e.numel() else 0.0
        norms = float(e.norm() * a.norm())
        cosine = float(e.dot(a) / norms) if norms > 0 else float(torch.equal(e, a))
        if not within(options, cosine, max_abs):
            return False
    return True


def record_tokens(report: QuantizationReport | None, name: str, generated: GenerationCheck) -> None:
    """A quantized artifact's greedy tokens against float eager's, in its entry of
    `report.targets` (tokens matched from the first; a quantized model may drift)."""
    if report is None:
        return
    first = generated.first_mismatch
    entry = report.targets.get(name) or QuantizedTarget(measured=True, passed=first is None)
    entry.generation = GeneratedTokens(
        matched=generated.max_new_tokens if first is None else first,
        max_new_tokens=generated.max_new_tokens,
        expected=generated.expected,
        generated=generated.generated,
    )
    report.targets[name] = entry


def measure(
    runner: Runner,
    program: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: QuantizeOptions,
    *,
    samples: int,
    names: Mapping[str, str] | None = None,
) -> tuple[VerificationReport, QuantizedTarget]:
    """Run `runner` (the quantized artifact) and the float eager `pristine` on the
    example and `samples` drawn inside `program`'s dynamic ranges (of the example's
    shapes with other values when it has none).

    The float eager model runs on a copy sharing `pristine`'s weights (a full copy would
    hold the weights twice: 6.4 GB for a 3.21B bfloat16 model). A bfloat16 or float16
    model's reference is computed in float32 from its own weights, one module widened at
    a time (`engine.verify.precision`), as the quantized copy computes; an output whose
    dtype differs from the reference's is compared widened to float32.

    Returns the artifact's verification report (each output within the budget or not)
    and its entry of `report.quantization.targets`.
    """
    started = time.perf_counter()
    inputs: list[tuple[str, dict[str, int], Any]] = [("example", {}, (args, kwargs))]
    if samples:
        # Without dynamic dimensions the samples vary the values (draw_values).
        drawn = draw_samples(program, args, kwargs, samples, 0, names)
        inputs += drawn or draw_values(args, kwargs, samples, 0)
    checks: list[SampleCheck] = []
    stats: dict[str, _Stats] = {}
    eager = _Eager(pristine, share=not module_copies.mutates_parameters(program))
    for label, symbols, drawn in inputs:
        if isinstance(drawn, str):
            checks.append(SampleCheck(label=label, symbols=symbols, status="skipped", reason=drawn))
            continue
        checks.append(_sample(label, symbols, drawn, runner, eager, options, stats))
    outputs = [each.output(path) for path, each in stats.items()]
    cosines = [o.cosine for o in outputs if o.cosine is not None]
    errors = [o.max_abs for o in outputs if o.max_abs is not None]
    top1 = [o.top1_agreement for o in outputs if o.top1_agreement is not None]
    passed = all(s.status == "passed" for s in checks if s.status != "skipped")
    report = VerificationReport(
        enabled=True, passed=passed, samples=checks, duration_s=time.perf_counter() - started
    )
    entry = QuantizedTarget(
        measured=True,
        passed=passed,
        cosine=min(cosines) if cosines else None,
        max_abs_error=max(errors) if errors else None,
        top1_agreement=min(top1) if top1 else None,
        samples=sum(1 for s in checks if s.status != "skipped"),
        outputs=outputs,
    )
    return report, entry


def _sample(
    label: str,
    symbols: dict[str, int],
    drawn: tuple[tuple[Any, ...], dict[str, Any]],
    runner: Runner,
    eager: _Eager,
    options: QuantizeOptions,
    stats: dict[str, _Stats],
) -> SampleCheck:
    sample_args, sample_kwargs = drawn
    common: dict[str, Any] = {"label": label, "symbols": symbols}
    with torch.no_grad():
        try:
            eager_args, eager_kwargs = copy.deepcopy((tuple(sample_args), dict(sample_kwargs)))
            expected = eager.run(eager_args, eager_kwargs)
        except Exception as exc:
            return SampleCheck(status="skipped", reason=f"eager run: {exc}", **common)
    changed = eager.weights.changed()
    if changed:
        reason = WEIGHTS_CHANGED + ", ".join(changed[:5])
        return SampleCheck(status="failed", reason=reason, **common)
    try:
        with torch.no_grad():
            actual = runner(*copy.deepcopy((tuple(sample_args), dict(sample_kwargs))))
    except Exception as exc:
        return SampleCheck(status="failed", reason=f"{EXPORTED_RAISED}{exc}", **common)
    expected_leaves = pytree.tree_leaves(expected)
    actual_paths = flatten_with_paths(actual)[0]
    if len(expected_leaves) != len(actual_paths):
        reason = f"the artifact returned {len(actual_paths)} outputs, eager {len(expected_leaves)}"
        return SampleCheck(status="failed", reason=reason, **common)
    tolerance = VerifyOptions(atol=options.max_abs or math.inf, rtol=0)
    checks: list[OutputCheck] = []
    for e, (path, a) in zip(expected_leaves, actual_paths, strict=True):
        if _floating(e) and _floating(a) and e.dtype != a.dtype:
            e, a = e.float(), a.float()  # the budget judges the values, not the dtype
        check = compare_leaf(path, e, a, tolerance)
        if (
            isinstance(e, torch.Tensor)
            and e.is_floating_point()
            and check.max_abs_error is not None
        ):
            measured = stats.setdefault(path, _Stats()).add(path, e, a)
            ok = within(options, measured, check.max_abs_error)
            check = check.model_copy(
                update={"passed": ok, "message": None if ok else "outside the accuracy budget"}
            )
        checks.append(check)
    ok = all(c.passed for c in checks)
    return SampleCheck(status="passed" if ok else "failed", outputs=checks, **common)


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


class _Eager:
    """The float eager model, run afresh on each sample: a copy sharing its weights
    (unless the program writes parameters), computed in float32 when its weights are in
    a reduced precision."""

    def __init__(self, pristine: torch.nn.Module, *, share: bool) -> None:
        self.pristine, self.share = pristine, share
        self.weights = module_copies.WeightVersions(pristine)
        self.widen = reduced_model(pristine)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fresh = module_copies.fresh(self.pristine, share=self.share)
        if self.widen:
            return float32_reference(fresh, args, kwargs)
        return fresh(*args, **kwargs)


class _Stats:
    """One output's errors, gathered over the samples."""

    def __init__(self) -> None:
        self.cosine: float | None = None
        self.max_abs = 0.0
        self.abs_sum = 0.0
        self.count = 0
        self.agree = 0
        self.rows = 0
        self.classifies = False

    def add(self, path: str, expected: torch.Tensor, actual: torch.Tensor) -> float:
        """Add one sample; returns its cosine."""
        e, a = expected.detach().double().flatten(), actual.detach().double().flatten()
        diff = (e - a).abs()
        if diff.numel():
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.abs_sum += float(diff.sum())
            self.count += diff.numel()
        norms = float(e.norm() * a.norm())
        cosine = float(e.dot(a) / norms) if norms > 0 else float(torch.equal(e, a))
        self.cosine = cosine if self.cosine is None else min(self.cosine, cosine)
        if (expected.dim() == 2 or "logits" in path) and expected.shape[-1] > 1:
            self.classifies = True
            top_e = expected.reshape(-1, expected.shape[-1]).argmax(-1)
            top_a = actual.reshape(-1, actual.shape[-1]).argmax(-1)
            self.agree += int((top_e == top_a).sum())
            self.rows += top_e.numel()
        return cosine

    def output(self, path: str) -> QuantizedOutput:
        return QuantizedOutput(
            path=path,
            cosine=self.cosine,
            max_abs=self.max_abs,
            mean_abs=self.abs_sum / self.count if self.count else 0.0,
            top1_agreement=self.agree / self.rows if self.classifies and self.rows else None,
        )
