"""`run_target`, what the pipeline calls for each deployment target: prepare, convert,
load and verify it through its module (`engine.targets.interface.Target`), with the
pipeline's own verification code (`engine.verify.verification.verify` with a runner), and
describe it all as a `TargetResult`. It never raises for a failing target, nor for one
over its time budget (`engine.targets.time_budget`); how a target fails is
`engine.targets.failures`'.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import importlib
import time
from pathlib import Path
from typing import Any

from engine.environment.target_requirements import missing
from engine.generation import (
    Generation,
    mismatch_details,
    mismatch_text,
    onnx_check,
    onnx_past,
    runner_check,
)
from engine.profile import profiling
from engine.quantization import accuracy, refusal, takes
from engine.targets import encoders, failures, time_budget
from engine.targets.failures import TargetError
from engine.targets.interface import (
    Conversion,
    FlatRunner,
    Target,
    TargetJob,
    structured_runner,
)
from engine.targets.registry import spec
from engine.verify import verification
from schemas import GenerationCheck, TargetResult, VerificationReport

__all__ = ["module", "run_target", "skipped"]


def module(name: str) -> Target:
    """Target `name`'s module (its registry row's `module`)."""
    found: Any = importlib.import_module(spec(name).module)
    return found


def run_target(name: str, job: TargetJob) -> TargetResult:
    """Convert, load and verify target `name` for `job`; the result says how it went.

    The artifact is written to `job.out_dir` under its registry name. Verification runs
    on the program's samples with the target's tolerances (a generation-ready export: the
    example's prefill, then the generation check); with option `quantize` the artifact's
    accuracy against the float eager model is measured instead and added to
    `job.quantizing.report` (a budget missed fails verification, not the target). Over
    `job.budget_s` it fails (`target_failed`, `details.reason` `timeout`), its files
    removed.
    """
    row = spec(name)
    path = job.out_dir / row.artifact
    options, generation, quantizing = job.options, job.generation, job.quantizing
    facts: dict[str, Any] = {}
    notes: list[str] = []
    check: VerificationReport | None = None
    encoder_check: VerificationReport | None = None
    generated: GenerationCheck | None = None
    in_runtime: GenerationCheck | None = None
    encoder = generation.encoder if generation is not None else None
    encoder_files: list[Path] = []
    started = time.perf_counter()
    duration: float | None = None
    phase = ["converting"]  # what it was doing when its budget ran out
    conversion: Conversion | None = None

    def told(what: str) -> None:
        phase[0] = what
        if job.progress is not None:
            job.progress(what)

    try:
        with time_budget.limit(job.budget_s):
            absent = missing(name)
            if absent:
                raise TargetError(
                    f"{name}: this worker lacks {', '.join(absent)}",
                    hint=row.install_hint,
                    details={"missing": absent},
                )
            if quantizing is not None and not takes(name, quantizing.scheme):
                message, hint, details = refusal(name, quantizing.scheme)
                raise TargetError(message, hint=hint, details=details)
            target = module(name)
            conversion = target.prepare(job)
            source, settings = conversion.source, conversion.settings
            target.convert(
                source, conversion.args, conversion.kwargs, path, facts=facts, **settings
            )
            if quantizing is not None and hasattr(target, "quantize_artifact"):
                target.quantize_artifact(path, job, conversion, facts)
            if quantizing is not None:
                quantizing.converted(name)
            if quantizing is not None or conversion.with_past is None:
                # converted: let a program made for the target go (the quantized one,
                # ExecuTorch's custom-op form: a widened 1.24B model's is 4.9 GB)
                source = job.traced  # what `load` takes (and reads not)
                conversion = dataclasses.replace(conversion, source=source)
            _freed()  # what the converter held, given back before the artifact loads
            told("loading")
            flat = target.load(path, source, **target.loading(settings, facts))
            told("verifying")
            encoder_flat = None
            if encoder is not None:
                encoder_flat, encoder_files = target.convert_encoder(encoder, path, settings, facts)
            duration = time.perf_counter() - started
            own = target.notes(facts)
            notes += own
            check = _verify(name, target, job, conversion, flat, notes)
            if check is not None and check.passed is False:
                check = _kept_or_raised(name, target, job, check, path, facts, notes, len(own))
            if encoder is not None and encoder_flat is not None and options.verify.enabled:
                encoder_check = encoders.verify(encoder, encoder_flat, target.tolerances(options))
                if encoder_check.passed is False:
                    _, where = failures.first_failure(encoder_check)
                    raise TargetError(
                        f"the {name} encoder does not match the eager encoder {where}",
                        hint=f"Look at targets.{name}.encoder; raise verify.atol/rtol if the "
                        "difference is numerical noise of this runtime's kernels.",
                        details={"program": "encoder"},
                    )
            if options.verify.enabled and generation is not None:
                generated = _generation_check(
                    flat,
                    generation,
                    conversion.with_past,
                    encoder_flat,
                    whole=quantizing is not None,
                )
                if quantizing is not None:
                    accuracy.record_tokens(quantizing.report, name, generated)
                elif not generated.passed:
                    _refuse_mismatch(name, path, generated)
                if hasattr(target, "runtime_generation"):
                    del flat  # the runtime loads the artifact again: one copy at a time
                    _freed()
                    in_runtime = target.runtime_generation(path, generation, settings, notes)
                    if in_runtime is not None and quantizing is None and not in_runtime.passed:
                        _refuse_mismatch(name, path, in_runtime, runtime=True)
    except (Exception, time_budget.TargetTimeout) as exc:
        if duration is None:
            duration = time.perf_counter() - started
        for written in [*_files(name, path), *_encoder_files(name, path)]:
            written.unlink(missing_ok=True)
        return TargetResult(
            status="failed",
            duration_s=duration,
            verification=check,
            encoder=encoder_check,
            generation=generated,
            runtime_generation=in_runtime,
            notes=notes,
            details=facts,
            error=(
                failures.timeout(name, job.budget_s or 0.0, phase=phase[0])
                if isinstance(exc, time_budget.TargetTimeout)
                else failures.error(name, exc)
            ),
        )
    if job.profiled is not None:
        job.profiled[name] = profiling.target_subject(
            name,
            target,
            path,
            job.traced,  # no target's `load` reads it: the quantized program is let go
            target.loading(settings, facts),
            conversion.args,
            conversion.kwargs,
            _files(name, path),
        )
    return TargetResult(
        status="succeeded",
        artifact=path.name,
        size=path.stat().st_size,
        artifacts=[
            written.name for written in [*_files(name, path), *encoder_files] if written.exists()
        ],
        duration_s=duration,
        verification=check,
        encoder=encoder_check,
        generation=generated,
        runtime_generation=in_runtime,
        notes=notes,
        details=facts,
    )


def _freed() -> None:
    """Free what only cycles still hold (a converter's graphs), then give the C heap's free
    memory back to the system: glibc keeps freed blocks under its mmap threshold (which
    rises to 32 MB as bigger blocks are freed) resident until `malloc_trim`."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


def skipped(reason: str) -> TargetResult:
    """A target not attempted, and why."""
    return TargetResult(status="skipped", notes=[reason])


def _verify(
    name: str,
    target: Target,
    job: TargetJob,
    conversion: Conversion,
    flat: FlatRunner,
    notes: list[str],
) -> VerificationReport | None:
    """The artifact against eager on the program's samples (the example only for a
    generation-ready export, none for an ONNX LLM, which generation verifies), or its
    accuracy against the float model with option `quantize`."""
    options, quantizing, program = job.options, job.quantizing, job.program
    if not options.verify.enabled:
        notes.append("not verified: verify.enabled is false")
        return VerificationReport(enabled=False)
    if conversion.with_past is not None:
        notes.append(
            "verified by generation only: model.onnx takes the KV cache as inputs and "
            "returns it, a program of its own beside program.pt2"
        )
        return None
    if quantizing is not None:
        samples = 0 if job.generation is not None else options.verify.samples
        check, measured = accuracy.measure(
            structured_runner(flat, program),
            program,
            job.pristine,
            job.args,
            job.kwargs,
            quantizing.options,
            samples=samples,
            names=job.names,
        )
        assert quantizing.report is not None
        quantizing.report.targets[name] = measured.model_copy(
            update={"method": quantizing.method(name)}
        )
        return check
    tolerances = target.tolerances(options)
    if job.generation is not None:  # the example's prefill, then generation
        tolerances = tolerances.model_copy(update={"samples": 0})
    return verification.verify(
        program,
        job.pristine,
        job.args,
        job.kwargs,
        tolerances,
        runner=structured_runner(flat, program),
        names=job.names,
        memory_mb=options.memory_mb,
    )


def _kept_or_raised(
    name: str,
    target: Target,
    job: TargetJob,
    check: VerificationReport,
    path: Path,
    facts: dict[str, Any],
    notes: list[str],
    own: int,
) -> VerificationReport:
    """A failed verification: kept for the range it ran (`target_range: "verified"`, a
    runtime that refused samples), else the target's error; with option `quantize`, an
    accuracy outside the budget (`quantization_inaccurate`) keeps the artifact."""
    raised, where = failures.first_failure(check)
    kept = None
    if raised and job.options.target_range == "verified" and job.quantizing is None:
        kept = failures.narrowed(check, name)
    if kept is not None:  # kept for the range it ran: the refusals are skipped
        check, facts["verified_range"] = kept
        notes[:own] = target.notes(facts)
        return check
    if raised:
        refused = failures.refusal(name, path.name, check, where, getattr(target, "bound", None))
        facts["verified_range"] = refused.details.get("verified_range", {})
        notes[:own] = target.notes(facts)
        raise refused
    if job.quantizing is None:
        raise TargetError(
            f"{path.name} does not match eager PyTorch {where}",
            hint=f"Look at targets.{name}.verification; raise verify.atol/rtol if the "
            "difference is numerical noise of this runtime's kernels.",
        )
    return check


def _generation_check(
    flat: FlatRunner,
    generation: Generation,
    with_past: onnx_past.PastProgram | None,
    encoder_flat: FlatRunner | None,
    *,
    whole: bool,
) -> GenerationCheck:
    """The artifact's generation check; `whole`: every run generates all its tokens (a
    quantized artifact's drift is recorded, not stopped at its first difference)."""
    if with_past is None:
        return runner_check(flat, generation, encoder_flat, whole=whole)
    return onnx_check(flat, with_past, generation, encoder_flat, whole=whole)


def _refuse_mismatch(
    name: str, path: Path, check: GenerationCheck, *, runtime: bool = False
) -> None:
    """Fail a float artifact whose greedy tokens differ from eager transformers' (in its
    runtime's own generation loop: `runtime`); a quantized one's drift is recorded."""
    where = "in its runtime's own generation loop " if runtime else ""
    raise TargetError(
        f"{path.name} generates other tokens than eager transformers {where}"
        + mismatch_text(check),
        hint=f"See targets.{name}.{'runtime_generation' if runtime else 'generation'} for "
        "both token lists.",
        details={
            "reason": "generation_mismatch",
            **({"runtime": True} if runtime else {}),
            **mismatch_details(check),
        },
    )


def _files(name: str, path: Path) -> list[Path]:
    """The artifact and the files a target may write beside it (not the encoder's)."""
    own = set(spec(name).companions) - set(_encoder_names(name))
    return [path, *(path.with_name(extra) for extra in sorted(own))]


def _encoder_names(name: str) -> list[str]:
    encoder = spec(name).encoder
    return [] if encoder is None else [encoder, encoder + ".data"]


def _encoder_files(name: str, path: Path) -> list[Path]:
    return [path.with_name(each) for each in _encoder_names(name)]
