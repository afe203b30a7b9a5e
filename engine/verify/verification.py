"""The VERIFY stage: the exported program against eager PyTorch.

`verify` runs the model eagerly and `ep.module()` on the example inputs and on extra
inputs drawn inside the program's dynamic ranges (each symbol at its minimum, at its
maximum, then at random values in between; derived dimensions such as `dimx + 1`
follow from the program's own shape expressions; drawn by `engine.shapes.sampling`), and
compares every output leaf, every mutated buffer and every input changed in place
(reported with the buffers, under its input path such as `args[0]`). The save → load
round trip is `engine.serialize.roundtrip`'s job.

When the model was wrapped for portability (`engine.serialize.portability`), pass the wrapper
and its plain inputs: eager and exported then take and return the same structures.

Each run gets its own copy of the module (a run may change buffers), sharing the weights
(`engine.load.module_copies`): a weight copy per run would double a big model's memory twice
per sample. A sample whose eager run wrote the weights fails (the reference is gone).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree

from engine.load import module_copies
from engine.profile import resident_memory
from engine.shapes.sampling import draw_samples
from engine.verify import precision
from engine.verify.flat import flatten_with_paths
from schemas import OutputCheck, SampleCheck, VerificationReport, VerifyOptions

__all__ = ["EXPORTED_RAISED", "WEIGHTS_CHANGED", "Runner", "default_tolerance", "verify"]

Runner = Callable[[tuple[Any, ...], dict[str, Any]], Any]
"""Runs something other than `ep.module()` on `(args, kwargs)` (a deployment target's
artifact in its own runtime) and returns the outputs in the program's structure."""

EXPORTED_RAISED = "the exported program raised: "
"""How a sample's reason starts when the exported program raised instead of returning."""

_EPS = 1e-7
"""The denominator guard of the relative error, as in torch.onnx's verification report."""

_LOW_PRECISION = {torch.float16, torch.bfloat16}

MEMORY_SHARE = 0.9
"""The share of the job's `memory_mb` a sample's estimated peak may reach; the rest is
left for what the estimate misses."""


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) used when the options leave them unset: exact for integers and bool."""
    # float8 types are coarser still; they get the half-precision defaults too.
    if dtype in _LOW_PRECISION or (dtype.is_floating_point and dtype.itemsize == 1):
        return 1e-3, 1.6e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-5, 1.3e-6
    return 0.0, 0.0


def verify(
    ep: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: VerifyOptions,
    *,
    seed: int = 0,
    runner: Runner | None = None,
    names: Mapping[str, str] | None = None,
    example_outputs: list[Any] | None = None,
    memory_mb: int | None = None,
) -> VerificationReport:
    """Compare `ep` with eager `pristine` on the example and on sampled inputs.

    Args:
        ep: the program to check (decomposed or not).
        pristine: the module `ep` was exported from, in its state before any run;
            copied for every run (sharing its weights), never run itself.
        args, kwargs: the example inputs `ep` was exported with.
        opts: tolerances and the number of extra samples.
        seed: makes the sampled sizes and values reproducible.
        runner: run this instead of `ep.module()` (the samples are still drawn from
            `ep`'s ranges); only outputs are compared then: a target's runtime keeps
            buffers and in-place input changes to itself.
        names: the user's dim names for torch's symbols: a sample's `symbols` use them.
        example_outputs: when given, the program's outputs on the example are appended
            to it (the round trip's expected outputs: the program is not run again).
        memory_mb: the job's memory limit: a sample whose estimated peak (the resident
            memory now, plus the memory the example's run added times the sample's
            `cost`, its input elements over the example's) exceeds `MEMORY_SHARE` of it
            is skipped (`bound` `memory_mb`), as is one costing more than
            `opts.max_sample_cost` (`bound` `max_sample_cost`).

    Returns:
        The report; `passed` is true when every check that was not skipped passed, and
        `verdict` is `verified` only when, in addition, no sample was skipped.
    """
    if not opts.enabled:
        return VerificationReport(enabled=False)
    started = time.perf_counter()
    # ep.module() shares its state tensors with ep: every run gets a deep copy, so a
    # buffer mutation never leaks into the next run, nor into the program later saved.
    template = ep.module() if runner is None else None
    copies = _Copies(pristine, template, share=not module_copies.mutates_parameters(ep))
    watch = resident_memory.PeakWatch().start()
    samples = [_run_sample("example", {}, copies, ep, args, kwargs, opts, runner, example_outputs)]
    example_added = watch.stop()[1]
    example_size = max(1, _elements(args, kwargs))
    if opts.samples:
        for label, symbols, inputs in draw_samples(ep, args, kwargs, opts.samples, seed, names):
            if isinstance(inputs, str):
                samples.append(
                    SampleCheck(label=label, symbols=symbols, status="skipped", reason=inputs)
                )
                continue
            sample_args, sample_kwargs = inputs
            cost = round(_elements(sample_args, sample_kwargs) / example_size, 2)
            bounded = _over_bound(cost, opts, example_added, memory_mb)
            if bounded is not None:
                bound, reason = bounded
                samples.append(
                    SampleCheck(
                        label=label,
                        symbols=symbols,
                        input_shapes=_input_shapes(sample_args, sample_kwargs),
                        status="skipped",
                        reason=reason,
                        cost=cost,
                        bound=bound,
                    )
                )
                continue
            samples.append(
                _run_sample(label, symbols, copies, ep, sample_args, sample_kwargs, opts, runner)
            )
    passed = all(s.status == "passed" for s in samples if s.status != "skipped")
    return VerificationReport(
        enabled=True,
        passed=passed,
        samples=samples,
        duration_s=time.perf_counter() - started,
    )


# --- one run ---------------------------------------------------------------------------


WEIGHTS_CHANGED = "the eager run changed the model's weights in place: "
"""How a sample's reason starts when the eager forward wrote its own parameters."""


class _Copies:
    """A fresh eager model and exported module for each run, sharing the weights unless
    the program itself writes parameters."""

    def __init__(
        self, pristine: torch.nn.Module, template: torch.nn.Module | None, *, share: bool
    ) -> None:
        self.pristine, self.template, self.share = pristine, template, share
        self.weights = module_copies.WeightVersions(pristine)

    def eager(self) -> torch.nn.Module:
        return module_copies.fresh(self.pristine, share=self.share)

    def exported(self) -> torch.nn.Module:
        assert self.template is not None
        return module_copies.fresh(self.template, share=self.share)


def _run_sample(
    label: str,
    symbols: dict[str, int],
    copies: _Copies,
    ep: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: VerifyOptions,
    runner: Runner | None = None,
    example_outputs: list[Any] | None = None,
) -> SampleCheck:
    shapes = _input_shapes(args, kwargs)
    common: dict[str, Any] = {"label": label, "symbols": symbols, "input_shapes": shapes}
    eager = copies.eager()
    eager_before = _buffers(eager)
    try:
        with torch.no_grad():
            eager_args, eager_kwargs = copy.deepcopy((tuple(args), dict(kwargs)))
            started = time.perf_counter()
            expected = eager(*eager_args, **eager_kwargs)
            common["eager_s"] = time.perf_counter() - started
    except Exception as exc:
        if label == "example":
            return SampleCheck(status="failed", reason=f"eager run: {_describe(exc)}", **common)
        # The model itself rejects this input (data-dependent indexing and the like):
        # nothing to compare, and nothing wrong with the program.
        return SampleCheck(status="skipped", reason=f"eager run: {_describe(exc)}", **common)
    changed = copies.weights.changed()
    if changed:
        return SampleCheck(
            status="failed", reason=WEIGHTS_CHANGED + ", ".join(changed[:5]), **common
        )

    if runner is not None:
        return _run_target_sample(runner, expected, copies.eager, (args, kwargs), opts, common)
    exported = copies.exported()
    exported_before = _buffers(exported)
    try:
        with torch.no_grad():
            exported_args, exported_kwargs = copy.deepcopy((tuple(args), dict(kwargs)))
            started = time.perf_counter()
            actual = exported(*exported_args, **exported_kwargs)
            common["exported_s"] = time.perf_counter() - started
    except Exception as exc:
        if label != "example" and _outside_guards(exc):
            # The program refuses this input with its own runtime check: the drawn size
            # lies in the range torch reports but outside a guard export added.
            return SampleCheck(
                status="skipped",
                reason=f"outside the program's guards: {_describe(exc)}",
                **common,
            )
        return SampleCheck(status="failed", reason=f"{EXPORTED_RAISED}{_describe(exc)}", **common)

    if example_outputs is not None:
        example_outputs.append(actual)
    outputs, reason = _compare_outputs(expected, actual, opts)
    eager_after, exported_after = _buffers(eager), _buffers(exported)
    buffers = _compare_buffers(
        ep, (eager_before, eager_after), (exported_before, exported_after), opts
    )
    if reason is None:
        outputs, buffers = precision.against_float32(
            (outputs, buffers),
            copies.eager,
            (args, kwargs),
            precision.Sides(expected, eager_after),
            precision.Sides(actual, exported_after),
            opts,
        )
    buffers += _compare_input_mutations(
        (args, kwargs), (eager_args, eager_kwargs), (exported_args, exported_kwargs), opts
    )
    ok = reason is None and all(c.passed for c in [*outputs, *buffers])
    return SampleCheck(
        status="passed" if ok else "failed",
        reason=reason,
        outputs=outputs,
        buffers=buffers,
        **common,
    )


def _run_target_sample(
    runner: Runner,
    expected: Any,
    eager: Callable[[], torch.nn.Module],
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    opts: VerifyOptions,
    common: dict[str, Any],
) -> SampleCheck:
    """The exported side of a sample run by a target's runtime: outputs only. An
    artifact that computes a reduced-precision model in float32 (ONNX's, widened) has its
    outputs rounded to eager's dtype, and is judged against a float32 reference as a
    reduced-precision program is (`precision.against_float32`)."""
    args, kwargs = inputs
    try:
        with torch.no_grad():
            copied = copy.deepcopy((tuple(args), dict(kwargs)))
            started = time.perf_counter()
            actual = runner(*copied)
            common["exported_s"] = time.perf_counter() - started
    except Exception as exc:
        return SampleCheck(status="failed", reason=f"{EXPORTED_RAISED}{_describe(exc)}", **common)
    actual = precision.rounded_like(expected, actual)
    outputs, reason = _compare_outputs(expected, actual, opts)
    if reason is None:
        outputs, _ = precision.against_float32(
            (outputs, []),
            eager,
            (args, kwargs),
            precision.Sides(expected, {}),
            precision.Sides(actual, {}),
            opts,
        )
    ok = reason is None and all(c.passed for c in outputs)
    return SampleCheck(
        status="passed" if ok else "failed", reason=reason, outputs=outputs, **common
    )


def _compare_outputs(
    expected: Any, actual: Any, opts: VerifyOptions
) -> tuple[list[OutputCheck], str | None]:
    expected_leaves = pytree.tree_leaves(expected)
    actual_paths = flatten_with_paths(actual)[0]
    if len(expected_leaves) != len(actual_paths):
        return [], (
            f"the exported program returned {len(actual_paths)} output leaves, "
            f"eager returned {len(expected_leaves)}"
        )
    # Compared by position: a portable wrapper may have renamed the containers, not the
    # leaves; paths are the exported program's.
    checks = [
        compare_leaf(path, e, a, opts)
        for e, (path, a) in zip(expected_leaves, actual_paths, strict=True)
    ]
    return checks, None


def _compare_buffers(
    ep: torch.export.ExportedProgram,
    eager: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    exported: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    opts: VerifyOptions,
) -> list[OutputCheck]:
    """Buffers (before, after the run) of each side compared after the run."""
    # A functional program lists its mutations; a training-IR program mutates in place
    # and lists none, so any buffer that changed on either side is compared too.
    names = set(ep.graph_signature.buffers_to_mutate.values())
    eager_before, eager_after = eager
    exported_before, exported_after = exported
    for name, before in eager_before.items():
        if name in eager_after and not _same(before, eager_after[name]):
            names.add(name)
    for name, before in exported_before.items():
        if name in exported_after and not _same(before, exported_after[name]):
            names.add(name)
    checks = []
    for name in sorted(names):
        e, a = eager_after.get(name), exported_after.get(name)
        if e is None or a is None:
            side = "eager model" if e is None else "exported program"
            checks.append(OutputCheck(path=name, passed=False, message=f"not in the {side}"))
            continue
        checks.append(compare_leaf(name, e, a, opts))
    return checks


def _compare_input_mutations(
    original: tuple[tuple[Any, ...], dict[str, Any]],
    eager: tuple[tuple[Any, ...], dict[str, Any]],
    exported: tuple[tuple[Any, ...], dict[str, Any]],
    opts: VerifyOptions,
) -> list[OutputCheck]:
    """Inputs the model changed in place on either side, compared like buffers."""
    checks = []
    for (path, before), (_, e), (_, a) in zip(
        _input_leaves(*original), _input_leaves(*eager), _input_leaves(*exported), strict=True
    ):
        if not isinstance(before, torch.Tensor):
            continue
        if _same(before, e) and isinstance(a, torch.Tensor) and _same(before, a):
            continue
        checks.append(compare_leaf(path, e, a, opts))
    return checks


def compare_leaf(path: str, expected: Any, actual: Any, opts: VerifyOptions) -> OutputCheck:
    """One leaf: shapes, dtypes, max abs/rel error and allclose (equality for non-tensors)."""
    if not isinstance(expected, torch.Tensor):
        same = type(expected) is type(actual) and expected == actual
        return OutputCheck(
            path=path,
            dtype=type(expected).__name__,
            passed=bool(same),
            message=None if same else "values differ",
        )
    atol, rtol = default_tolerance(expected.dtype)
    atol = opts.atol if opts.atol is not None else atol
    rtol = opts.rtol if opts.rtol is not None else rtol
    check: dict[str, Any] = {
        "path": path,
        "shape": list(expected.shape),
        "dtype": _dtype_name(expected.dtype),
        "atol": atol,
        "rtol": rtol,
    }
    if not isinstance(actual, torch.Tensor):
        return OutputCheck(passed=False, message="exported value is not a tensor", **check)
    if actual.shape != expected.shape:
        return OutputCheck(passed=False, message=f"shape {list(actual.shape)}", **check)
    if actual.dtype != expected.dtype:
        message = f"dtype {_dtype_name(actual.dtype)}"
        return OutputCheck(passed=False, message=message, **check)
    e, a = expected.detach().cpu(), actual.detach().cpu()
    abs_err, rel_err = _errors(e, a)
    if e.is_floating_point() or e.is_complex():
        passed = bool(torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True))
    else:
        passed = bool(torch.equal(a, e))
    return OutputCheck(
        passed=passed,
        max_abs_error=abs_err,
        max_rel_error=rel_err,
        message=None if passed else "outside tolerance",
        **check,
    )


def _errors(e: torch.Tensor, a: torch.Tensor) -> tuple[float | None, float | None]:
    if e.numel() == 0:
        return 0.0, 0.0
    wide = torch.complex128 if e.is_complex() else torch.float64
    e64, a64 = e.to(wide), a.to(wide)
    diff = (e64 - a64).abs()
    rel = diff / (e64.abs() + _EPS)
    # NaN at the same place on both sides is agreement; elsewhere it is the largest error.
    both_nan = e64.isnan() & a64.isnan()
    diff = diff.masked_fill(both_nan, 0.0)
    rel = rel.masked_fill(both_nan, 0.0)
    return float(diff.max()), float(rel.max())


def _over_bound(
    cost: float, opts: VerifyOptions, example_added_mb: float | None, memory_mb: int | None
) -> tuple[Literal["max_sample_cost", "memory_mb"], str] | None:
    """Which bound a sample of `cost` crosses, and why; None when it may run."""
    if opts.max_sample_cost is not None and cost > opts.max_sample_cost:
        return "max_sample_cost", (
            f"over verify.max_sample_cost: {cost:g} times the example's input elements "
            f"(at most {opts.max_sample_cost:g})"
        )
    now = resident_memory.resident()
    if memory_mb is None or example_added_mb is None or now is None or cost <= 1:
        return None
    estimate = now / 2**20 + cost * example_added_mb
    if estimate <= MEMORY_SHARE * memory_mb:
        return None
    return "memory_mb", (
        f"over the job's memory: estimated peak {estimate:.0f} MB ({cost:g} times the "
        f"example's inputs, whose run added {example_added_mb:.0f} MB) of memory_mb "
        f"{memory_mb}"
    )


# --- small pieces ----------------------------------------------------------------------


def _elements(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return sum(
        leaf.numel() for _, leaf in _input_leaves(args, kwargs) if isinstance(leaf, torch.Tensor)
    )


def _input_shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, list[int | str]]:
    return {
        path: list(leaf.shape)
        for path, leaf in _input_leaves(args, kwargs)
        if isinstance(leaf, torch.Tensor)
    }


def _input_leaves(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """Input leaves with paths like `args[0]` and `kwargs['mask']`."""
    leaves = []
    for prefix, tree in (("args", tuple(args)), ("kwargs", dict(kwargs))):
        leaves += [(prefix + path, leaf) for path, leaf in flatten_with_paths(tree)[0]]
    return leaves


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.detach().clone() for name, b in module.named_buffers()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_GUARD_MESSAGES = ("Guard failed", "Runtime assertion failed")


def _outside_guards(exc: BaseException) -> bool:
    """Whether the exported program rejected its input with one of its own checks."""
    return isinstance(exc, AssertionError | RuntimeError) and any(
        marker in str(exc) for marker in _GUARD_MESSAGES
    )


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
