"""The stages after serializing: `converting` (the deployment targets, each within its
time budget) and `profiling`, and the provisional report a sandboxed job writes before
each target and before profiling.

Each target gets a budget (`engine.targets.time_budget.share`): option `target_timeout_s`, or an
equal share of what is left of the job's time limit among the targets not yet converted;
never more than the job has left, less a reserve for the report and the profiles. One
over it fails (`target_failed`, `details.reason` `timeout`) and the next one starts.

The provisional reports (`ExportRequest.provisional_report`) are the report as it would
be were the job stopped there: by its time limit (`report.partial.json`: the stage in
progress failed, the target in progress `target_failed` with `reason` `timeout` and
`limit` `timeout_s`, the ones after it skipped; else warning `timeout`) or by a crash of
its process in native code (`report.crashed.json`: `reason` `crashed`; else warning
`crashed`). A worker whose job stops so delivers the matching one, with `program.pt2`
and the targets finished, instead of nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from engine.errors import QuantizationInaccurate, TargetFailed
from engine.load.model import LoadedModel
from engine.pipeline.run_state import ExportRun
from engine.pipeline.steps import partial_verification_warning, write_json
from engine.profile import profiling
from engine.serialize.artifacts import CRASH_REPORT, PROGRAM, PROVISIONAL_REPORT
from engine.targets import time_budget
from schemas import ReportWarning, StageRecord, TargetResult

__all__ = [
    "TARGET_PHASES",
    "convert_targets",
    "profile_artifacts",
    "quantization_check",
    "quantizing_for",
    "write_provisional",
]


def convert_targets(
    run: ExportRun,
    artifacts: dict[str, Path],
    ep: torch.export.ExportedProgram,
    traced: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    loaded: LoadedModel,
    names: Mapping[str, str] | None = None,
    profiled: dict[str, profiling.Subject] | None = None,
    dynamic_shapes: Any = None,
) -> None:
    """The deployment targets asked for, each converted from the job's own programs and
    verified in its runtime within its time budget (`time_budget.share`); a failed one (or
    one over its budget: `reason` `timeout`) is a `target_failed` warning, or the job's
    error when `targets_required`. `profiled` gathers the succeeded ones to profile.
    With option `quantize`, each is quantized (`report.quantization`); one outside the
    accuracy budget is a `quantization_inaccurate` warning, or the job's error when
    `targets_required`. `dynamic_shapes`: the torch spec `traced` was exported with."""
    from engine import targets
    from engine.targets import failed_ops

    options = run.request.options
    wanted = [name for name in targets.ORDER if name in options.targets]
    quantizing = quantizing_for(run, traced, pristine, loaded, dynamic_shapes)
    with run.step("converting", ", ".join(wanted)), _released(quantizing):
        for index, name in enumerate(wanted):
            run.emit(index / len(wanted), f"{name}: converting and verifying")
            budget = time_budget.share(
                run.time_left(), run.time_limit_s, len(wanted) - index, options.target_timeout_s
            )
            write_provisional(run, artifacts, running=name, budget_s=budget)

            def phase(what: str, index: int = index, name: str = name) -> None:
                share = TARGET_PHASES[what]
                run.emit((index + share) / len(wanted), f"{name}: {what}")

            job = targets.TargetJob(
                program=ep,
                traced=traced,
                pristine=pristine,
                args=loaded.args,
                kwargs=loaded.kwargs,
                out_dir=run.request.out_dir,
                options=options,
                names=names,
                task=loaded.checkpoint.task if loaded.checkpoint is not None else None,
                generation=loaded.generation,
                progress=phase,
                profiled=profiled,
                quantizing=quantizing,
                budget_s=budget,
            )
            result = targets.run_target(name, job)
            if quantizing is not None:
                quantization_check(run, quantizing, name, result)
            if result.error is not None:  # name the op it failed on, and the user's line
                pinned = failed_ops.pinpoint(result.error, (ep, traced), loaded.source_map)
                result = result.model_copy(update={"error": pinned})
            run.targets[name] = result
            if result.status == "succeeded" and result.artifact is not None:
                for written in result.artifacts or [result.artifact]:
                    artifacts[written] = run.request.out_dir / written
                if result.verification is not None:
                    partial = partial_verification_warning(result.verification, target=name)
                    if partial is not None:
                        run.warnings.append(partial)
                continue
            error = result.error
            message = error.message if error is not None else f"target {name} failed"
            details = {**(error.details if error is not None else {}), "target": name}
            if options.targets_required:
                raise TargetFailed(
                    message,
                    hint=error.hint if error is not None else None,
                    location=error.location if error is not None else None,
                    details=details,
                )
            run.warnings.append(
                ReportWarning(code="target_failed", message=message, details=details)
            )
        write_provisional(run, artifacts)  # nothing runs now: stopped at the stage's end


@contextlib.contextmanager
def _released(quantizing: Any) -> Iterator[None]:
    """The quantized programs let go once every target is converted (a 3B model's hold
    gigabytes the profiles and the report need not)."""
    try:
        yield
    finally:
        if quantizing is not None:
            quantizing.release()


def quantizing_for(
    run: ExportRun,
    traced: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    loaded: LoadedModel,
    dynamic_shapes: Any,
) -> Any:
    """The job's `engine.quantization.Quantizing` (calibrated on the `calibration` upload,
    or else on the example and the verification samples), or None when option `quantize`
    asks for none.

    Raises:
        InvalidInputs: a calibration sample the traced program cannot take."""
    options = run.request.options
    if options.quantize.scheme == "none":
        return None
    from engine.quantization import Quantizing
    from engine.quantization.calibration import calibration_inputs

    example = (loaded.args, loaded.kwargs)
    calibration, source = calibration_inputs(
        traced, example, loaded.calibration, options.verify.samples
    )
    quantizing = Quantizing(
        options=options.quantize,
        traced=traced,
        pristine=pristine,
        args=loaded.args,
        kwargs=loaded.kwargs,
        dynamic_shapes=dynamic_shapes,
        calibration=calibration,
        calibration_source=source,
        strict=bool(run.sections["tracing"].strict_used),
        pending=set(options.targets),
    )
    run.sections["quantization"] = quantizing.report
    return quantizing


def quantization_check(run: ExportRun, quantizing: Any, name: str, result: Any) -> None:
    """Record a target's accuracy against float (not measured when it failed or was not
    verified); outside the budget: `quantization_inaccurate`, a warning, or the job's
    error when `targets_required`."""
    from schemas.quantization import QuantizedTarget

    report = quantizing.report
    run.sections["quantization"] = report  # the report document copies it
    entry = report.targets.get(name)
    if entry is None or result.status != "succeeded":
        report.targets[name] = QuantizedTarget(measured=False)
        return
    if entry.passed is not False:
        return
    budget = (
        f"max abs {report.max_abs}" if report.max_abs is not None else f"cosine {report.min_cosine}"
    )
    message = (
        f"{name}: the {report.scheme} artifact is outside the accuracy budget ({budget}) "
        f"against the float model: cosine {entry.cosine}, max abs {entry.max_abs_error}"
    )
    details = {
        "target": name,
        "scheme": report.scheme,
        "cosine": entry.cosine,
        "max_abs_error": entry.max_abs_error,
        "min_cosine": report.min_cosine,
        "max_abs": report.max_abs,
    }
    if run.request.options.targets_required:
        raise QuantizationInaccurate(
            message,
            hint="See report.quantization; loosen quantize.min_cosine or quantize.max_abs, or "
            "try a milder scheme (int8_dynamic, int8_weight_only).",
            details=details,
        )
    run.warnings.append(
        ReportWarning(code="quantization_inaccurate", message=message, details=details)
    )


TARGET_PHASES = {"loading": 0.7, "verifying": 0.8}
"""Where in one target's share of `converting` its phases begin: converting it takes most
of the time, loading and verifying the rest (a rough split; the page's estimate of the time
left reads these fractions)."""


def profile_artifacts(
    run: ExportRun,
    artifacts: dict[str, Path],
    pristine: torch.nn.Module,
    loaded: LoadedModel,
    profiled: dict[str, profiling.Subject],
) -> None:
    """Stage `profiling`: the eager model, `program.pt2` and each succeeded target loaded
    and timed on the example inputs (`report.profile`); it never fails the job."""
    from engine.targets import ORDER

    options = run.request.options
    with run.step("profiling", "latency, load time and memory of each artifact"):
        write_provisional(run, artifacts)
        subjects = [
            profiling.eager_subject(pristine, loaded.args, loaded.kwargs),
            profiling.program_subject(run.request.out_dir / PROGRAM, loaded.args, loaded.kwargs),
        ]
        for name in ORDER:
            result = run.targets.get(name)
            if name in profiled and result is not None and result.status == "succeeded":
                subjects.append(profiled[name])
        if loaded.generation is not None:  # decode steps too, where the cache is state
            length = loaded.generation.max_cache_len
            prompt = loaded.generation.prompt
            subjects = [profiling.decoding(each, length, prompt) for each in subjects]
        elapsed = sum(stage.duration_s for stage in run.stages)
        run.sections["profile"] = profiling.profile(
            subjects,
            options.profile,
            budget_s=profiling.budget(options, elapsed),
            device=options.device,
            memory_mb=options.memory_mb,
            progress=run.emit,
        )


def write_provisional(
    run: ExportRun,
    artifacts: dict[str, Path],
    *,
    running: str | None = None,
    budget_s: float | None = None,
) -> None:
    """Write the provisional reports when the request asks for them: the report were the
    job stopped now in stage `run.stage`, with target `running` (its budget `budget_s`)
    in progress: by its time limit (`report.partial.json`) and by a crash of its process
    (`report.crashed.json`). Each written whole, then renamed into place: a job stopped
    while writing leaves the previous one."""
    if not run.request.provisional_report:
        return
    for name, cause in ((PROVISIONAL_REPORT, "timeout"), (CRASH_REPORT, "crashed")):
        report = _stopped(run, artifacts, cause, running, budget_s)
        path = run.request.out_dir / name
        written = path.with_name(path.name + ".tmp")
        write_json(written, report, {})
        os.replace(written, path)


def _stopped(
    run: ExportRun,
    artifacts: dict[str, Path],
    cause: str,
    running: str | None,
    budget_s: float | None,
) -> Any:
    """The report of a job stopped now by `cause`: `timeout` (its time limit) or `crashed`
    (its process died of a signal)."""
    from engine.targets import failures

    options, limit = run.request.options, run.time_limit_s
    stages = [
        *run.stages,
        StageRecord(
            name=run.stage,
            status="failed",
            duration_s=time.perf_counter() - run.stage_started,
            message="stopped by the job's time limit"
            if cause == "timeout"
            else "the job's process crashed",
        ),
    ]
    targets, warnings = dict(run.targets), list(run.warnings)
    error = None
    if running is not None:
        body = (
            failures.timeout(running, budget_s or 0.0, timeout_s=limit)
            if cause == "timeout"
            else failures.crashed(running)
        )
        targets[running] = TargetResult(status="failed", error=body)
        if options.targets_required:
            error = body
        else:
            warnings.append(
                ReportWarning(code="target_failed", message=body.message, details=body.details)
            )
    elif cause == "timeout":
        warnings.append(
            ReportWarning(
                code="timeout",
                message=f"The job reached its time limit of {limit:g} s (`timeout_s`) in stage "
                f"{run.stage} and was stopped; what it finished before is kept.",
                details={"stage": run.stage, "timeout_s": limit},
            )
        )
    else:
        warnings.append(
            ReportWarning(
                code="crashed",
                message=f"The job's process crashed in stage {run.stage} (native code); what "
                "it finished before is kept.",
                details={"stage": run.stage},
            )
        )
    why = (
        "The job reached its time limit before this target was converted."
        if cause == "timeout"
        else "The job's process crashed before this target was converted."
    )
    for name in options.targets:
        targets.setdefault(name, TargetResult(status="skipped", notes=[why]))
    return run.report(error, artifacts, stages=stages, warnings=warnings, targets=targets)
