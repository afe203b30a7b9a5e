"""How a deployment target fails, in the contract's words: `TargetError` (a failure with
what to do about it), the `target_failed` body of any exception (`error`), of a target
over its time budget (`timeout`), and a runtime that refuses inputs the program accepts
(`refusal`, `narrowed`: the target kept for the range it ran, option `target_range`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from engine.targets import failed_ops
from engine.targets.registry import spec
from engine.verify import verification
from schemas import ErrorBody, SampleCheck, VerificationReport
from schemas.outcomes import error_body

__all__ = [
    "RUNTIME_BOUND",
    "TargetError",
    "clean",
    "describe",
    "error",
    "first_failure",
    "narrowed",
    "refusal",
    "timeout",
]


class TargetError(Exception):
    """A target that cannot be produced or does not run, with what to do about it."""

    def __init__(
        self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def clean(text: str) -> str:
    """`text` without terminal colour codes (converters colour their messages)."""
    return _ANSI.sub("", text)


def error(name: str, exc: BaseException) -> ErrorBody:
    """The `target_failed` body of target `name`'s failure `exc`."""
    if isinstance(exc, TargetError):
        message, hint, details = exc.message, exc.hint, dict(exc.details)
    elif _out_of_memory(exc):
        requested = _REQUESTED.search(str(exc))
        message = f"{name}: the job ran out of memory converting, loading or verifying it"
        if requested:
            message += f" (an allocation of {int(requested.group(1)):,} bytes failed)"
        hint = (
            "The job's memory held the program but not this target as well: raise "
            "`memory_mb` (unset, it is sized from the checkpoint or the default), "
            "or leave this target out of `targets`. program.pt2 and the targets finished "
            "before it are kept."
        )
        details = {"exception": type(exc).__name__, "reason": "out_of_memory"}
        if requested:
            details["requested_bytes"] = int(requested.group(1))
    else:
        lines = clean(str(exc)).strip().splitlines()
        message = f"{name}: {type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
        hint = spec(name).failure_hint
        details = {"exception": type(exc).__name__}
    details.update(failed_ops.named_op(exc))
    details["target"] = name
    return error_body("target_failed", message, hint=hint, stage="converting", details=details)


_REQUESTED = re.compile(r"tried to allocate (\d+) bytes")
"""torch's CPU allocator's message when an allocation fails."""


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (the job's RLIMIT_DATA, or the host)."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and "DefaultCPUAllocator:" in str(exc)
        and _REQUESTED.search(str(exc)) is not None
    )


def crashed(name: str) -> ErrorBody:
    """The `target_failed` body of target `name` whose conversion or runtime crashed the
    job's process (`reason` `crashed`; the worker adds the `signal`)."""
    return error_body(
        "target_failed",
        f"{name}: the job's process crashed while this target was converted, loaded or "
        "verified (native code of its converter or runtime)",
        hint="program.pt2 and the targets finished before it are kept. Leave this target out "
        "of `targets`, or try other settings for it (onnx.opset, onnx.dtype, narrower dynamic "
        "ranges); the crash is a bug of the converter or runtime named in the environment.",
        stage="converting",
        details={"target": name, "reason": "crashed"},
    )


def timeout(
    name: str, budget_s: float, *, phase: str | None = None, timeout_s: float | None = None
) -> ErrorBody:
    """The `target_failed` body of target `name` stopped at its time budget (`reason`
    `timeout`): by its own budget (`limit` `target_timeout_s`, in `phase`), or, given
    `timeout_s`, by the job's time limit (the worker stopped the job while it ran)."""
    details: dict[str, Any] = {
        "target": name,
        "reason": "timeout",
        "budget_s": round(budget_s, 3),
        "limit": "target_timeout_s" if timeout_s is None else "timeout_s",
    }
    if timeout_s is None:
        details["phase"] = phase
        message = f"{name}: not finished within its time budget of {budget_s:.3g} s ({phase})"
        hint = (
            "Raise `target_timeout_s` (unset, each target gets an equal share of what "
            "`timeout_s` leaves after the program: raise `timeout_s`), or leave this target "
            "out of `targets`. program.pt2 and the other targets are kept."
        )
    else:
        details["timeout_s"] = timeout_s
        message = (
            f"{name}: the job reached its time limit of {timeout_s:g} s (`timeout_s`) while "
            "this target was converted or verified, and was stopped"
        )
        hint = (
            "Raise `timeout_s`, or leave this target out of `targets`. program.pt2 and the "
            "targets finished before it are kept."
        )
    return error_body("target_failed", message, hint=hint, stage="converting", details=details)


def first_failure(check: VerificationReport) -> tuple[bool, str]:
    """Whether the first failed sample raised in the runtime, and where and how it failed."""
    for sample in check.samples:
        if sample.status != "failed":
            continue
        shapes = ", ".join(f"{k} {list(v)}" for k, v in sample.input_shapes.items())
        where = f"on sample {sample.label!r} ({shapes})" if shapes else f"on {sample.label!r}"
        for out in sample.outputs:
            if not out.passed:
                return False, (
                    f"{where}: {out.path or 'the output'} {out.message or 'differs'} "
                    f"(max abs error {out.max_abs_error}, atol {out.atol}, rtol {out.rtol})"
                )
        reason = sample.reason or ""
        if reason.startswith(verification.EXPORTED_RAISED):
            return True, f"{where}: {clean(reason.removeprefix(verification.EXPORTED_RAISED))}"
        return False, f"{where}: {reason}"
    return False, "(verification failed)"


RUNTIME_BOUND = "runtime"
"""A refused sample's `bound` in a target kept for the range it ran (`narrowed`)."""


def _refused(sample: SampleCheck) -> bool:
    return sample.status == "failed" and (sample.reason or "").startswith(
        verification.EXPORTED_RAISED
    )


Ranges = dict[str, dict[str, list[int]]]
"""Input → dim (its index, as text) → the smallest and largest size the samples gave it."""


def _ran(check: VerificationReport) -> Ranges:
    """The sizes the samples that passed gave each input's dims that vary across the
    samples (the dynamic ones): the shapes the target was verified on."""
    sizes: dict[str, dict[str, set[int]]] = {}
    for sample in check.samples:
        for name, shape in sample.input_shapes.items():
            for index, size in enumerate(shape):
                if isinstance(size, int):
                    sizes.setdefault(name, {}).setdefault(str(index), set()).add(size)
    passed = [sample for sample in check.samples if sample.status == "passed"]
    found: Ranges = {}
    for name, dims in sizes.items():
        for dim, seen in dims.items():
            ran = [
                int(sample.input_shapes[name][int(dim)])
                for sample in passed
                if name in sample.input_shapes and len(sample.input_shapes[name]) > int(dim)
            ]
            if len(seen) > 1 and ran:
                found.setdefault(name, {})[dim] = [min(ran), max(ran)]
    return found


def _outside(sample: SampleCheck, ran: Ranges) -> bool:
    """Whether one of the sample's input dims is outside the range that passed."""
    for name, dims in ran.items():
        shape = sample.input_shapes.get(name)
        for dim, (low, high) in dims.items():
            if shape is not None and len(shape) > int(dim):
                size = shape[int(dim)]
                if isinstance(size, int) and not low <= size <= high:
                    return True
    return False


def narrowed(check: VerificationReport, runtime: str) -> tuple[VerificationReport, Ranges] | None:
    """`check` with each sample the runtime refused (it raised) as a skipped sample
    (`bound` `runtime`), and the sizes of each dynamic input dim the passing samples
    covered: the range the target was verified on. None when that range is no honest
    claim: a sample failed by its outputs, none passed, or a refused one lies inside the
    range (each refused sample must have a dim outside it)."""
    ran = _ran(check)
    refused = [sample for sample in check.samples if _refused(sample)]
    failed = [s for s in check.samples if s.status == "failed" and not _refused(s)]
    if failed or not refused or not ran or not all(_outside(s, ran) for s in refused):
        return None
    samples = [
        sample.model_copy(
            update={
                "status": "skipped",
                "bound": RUNTIME_BOUND,
                "reason": f"the {runtime} runtime refused it: "
                + clean((sample.reason or "").removeprefix(verification.EXPORTED_RAISED)),
            }
        )
        if _refused(sample)
        else sample
        for sample in check.samples
    ]
    kept = check.model_copy(
        update={"samples": samples, "passed": True, "verdict": None, "checked": None}
    )
    kept.skipped = None
    return VerificationReport.model_validate(kept.model_dump()), ran


def refusal(
    name: str,
    artifact: str,
    check: VerificationReport,
    where: str,
    parse: Callable[[str], dict[str, Any] | None] | None,
) -> TargetError:
    """The failure of a target whose runtime refused a sample the program accepts: the
    runtime's own message (in `where`), and when `parse` finds the bound it met (an
    ExecuTorch memory plan's capacity), the bound and the largest size that fits it in
    the hint; `details.verified_range`: what the samples that passed covered."""
    sample = next(s for s in check.samples if _refused(s))
    said = clean((sample.reason or "").removeprefix(verification.EXPORTED_RAISED))
    ran = _ran(check)
    details: dict[str, Any] = {"reason": "runtime_refused", "runtime_message": said}
    if ran:
        details["verified_range"] = ran
    found = parse(said) if parse is not None else None
    keep = (
        ' or set `target_range: "verified"` to keep it for the range it was verified on'
        f" ({describe(ran)})"
        if ran and all(_outside(s, ran) for s in check.samples if _refused(s))
        else ""
    )
    if found is None:
        hint = (
            f"The {name} runtime rejected an input the program accepts; see "
            f"targets.{name}.verification for the sample and its shapes. Narrow the dynamic "
            f"range to what it runs{keep}."
        )
        return TargetError(f"{artifact} fails in its runtime {where}", hint=hint, details=details)
    details.update(found)
    fit = _largest_fit(sample, check, found)
    if fit is not None:
        details.update(fit)
    bound = f"at most {found['capacity']} elements"
    if fit is not None:
        bound += f" ({fit['input']} dim {fit['dim']} up to {fit['largest_fit']})"
    hint = (
        f"The {name} runtime holds {bound} for an input its memory plan bounds, below the "
        f"declared range: the sample needed {found['requested']} elements. Declare that max "
        f"in dynamic_shapes{keep}."
    )
    return TargetError(f"{artifact} fails in its runtime {where}", hint=hint, details=details)


def describe(ran: Ranges) -> str:
    """`args[0] dim 0: 1…4` for each dim of `ran`."""
    return ", ".join(
        f"{name} dim {dim}: {low}…{high}"
        for name, dims in ran.items()
        for dim, (low, high) in dims.items()
    )


def _largest_fit(
    refused: SampleCheck, check: VerificationReport, found: dict[str, Any]
) -> dict[str, Any] | None:
    """The input that needed `found["requested"]` elements in the refused sample, the one
    dim it varies along across the samples, and the largest size of that dim within the
    bound's capacity; None when the sample does not say."""
    requested, capacity = found.get("requested"), found.get("capacity")
    if not isinstance(requested, int) or not isinstance(capacity, int):
        return None
    for input_name, shape in refused.input_shapes.items():
        dims = list(shape)
        if _elements(dims) != requested:
            continue
        varying = {
            index
            for other in check.samples
            if input_name in other.input_shapes and len(other.input_shapes[input_name]) == len(dims)
            for index, size in enumerate(other.input_shapes[input_name])
            if size != dims[index]
        }
        if len(varying) != 1:
            return None
        dim = varying.pop()
        size = dims[dim]
        per = requested // size if isinstance(size, int) and size else 0
        if not per:
            return None
        return {"input": input_name, "dim": dim, "largest_fit": capacity // per}
    return None


def _elements(dims: list[Any]) -> int | None:
    total = 1
    for size in dims:
        if not isinstance(size, int):
            return None
        total *= size
    return total
