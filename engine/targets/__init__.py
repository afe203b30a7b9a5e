"""Deployment targets: the exported program converted for the runtimes people deploy with,
each artifact run back in its own runtime and compared with eager PyTorch.

- `onnx` (`engine.targets.onnx`): `model.onnx` from `torch.onnx.export(ep, dynamo=True)`,
  run by ONNX Runtime (CPU provider);
- `aoti` (`engine.targets.aoti`): `model.aoti.pt2` from
  `torch._inductor.aoti_compile_and_package`, run by `torch._inductor.aoti_load_package`;
- `executorch` (`engine.targets.executorch`): `model.pte` from
  `to_edge_transform_and_lower` with the XNNPACK partitioner, run by the ExecuTorch runtime.

Each target module is a set of plain functions with explicit paths in and out and no
global state: `convert(program, args, kwargs, path, ...) -> Path` writes the artifact,
`load(path, program, ...) -> FlatRunner` loads it for running. Their third-party packages
(onnx, onnxscript, onnxruntime, executorch) are imported only inside those functions, so
importing this package costs nothing; `missing(name)` says which are absent (it and
`REQUIRES` live in the torch-free `engine.environment.target_requirements`, for
describing a worker).

`run_target` is what the pipeline calls: convert, load, verify with the pipeline's own
verification code (`engine.verify.verification.verify` with a runner), and describe it all as a
`TargetResult`; it never raises for a failing target, nor for one over its time budget
(`engine.targets.time_budget`). How a target fails is `engine.targets.failures`'.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.environment.target_requirements import REQUIRES, missing
from engine.generation import (
    Generation,
    mismatch_details,
    mismatch_text,
    onnx_check,
    onnx_past,
    runner_check,
)
from engine.profile import profiling
from engine.quantization import Quantizing, accuracy, refusal, takes
from engine.serialize.artifacts import TARGET_ARTIFACTS, TARGET_COMPANIONS
from engine.targets import encoders, failures, time_budget
from engine.targets.failures import HINTS as _HINTS
from engine.targets.failures import TargetError, clean
from engine.verify import verification
from schemas import (
    ExportOptions,
    GenerationCheck,
    TargetResult,
    VerificationReport,
    VerifyOptions,
)
from schemas.version import __version__

__all__ = [
    "INSTALL_HINTS",
    "ORDER",
    "REQUIRES",
    "_HINTS",
    "FlatRunner",
    "TargetError",
    "clean",
    "missing",
    "run_target",
    "skipped",
    "structured_runner",
]

FlatRunner = Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]]
"""Runs a loaded artifact on `(args, kwargs)` and returns its outputs as a flat list."""

ORDER = ("onnx", "aoti", "executorch")
"""The order targets are converted in, whatever order the options name them in."""


_EXTRA = "pip install 'torchport[targets]'"
EXECUTORCH_INSTALL = (
    "pip install --no-deps executorch==1.4.1 torchao==0.18.0 and pip install "
    "ruamel.yaml==0.19.1 tabulate==0.10.0 (executorch's own dependency list would pull "
    "coremltools, pandas, scikit-learn and another torch)"
)
INSTALL_HINTS = {
    "onnx": f"Install the `targets` extra on the worker: {_EXTRA}.",
    "aoti": "AOTInductor needs a C++ compiler (g++) on the worker.",
    "executorch": f"Install the `targets` extra on the worker ({_EXTRA}), then "
    f"{EXECUTORCH_INSTALL}.",
}


def _module(name: str) -> Any:
    return importlib.import_module(f"engine.targets.{name}")


def structured_runner(flat: FlatRunner, program: torch.export.ExportedProgram) -> Any:
    """A runner returning outputs in the program's own structure (its `out_spec`), so
    the verification table names them as it names the program's outputs."""
    spec = program.call_spec.out_spec
    count = spec.num_leaves if spec is not None else None

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        leaves = list(flat(args, kwargs))
        if spec is None or count is None:
            return leaves
        if len(leaves) > count:
            # A runtime that also returns the mutated buffers puts them first, as the
            # program's own output list does.
            leaves = leaves[len(leaves) - count :]
        if len(leaves) != count:
            raise RuntimeError(f"the artifact returned {len(leaves)} outputs, the program {count}")
        return pytree.tree_unflatten(leaves, spec)

    return run


def run_target(
    name: str,
    *,
    program: torch.export.ExportedProgram,
    traced: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out_dir: Path,
    options: ExportOptions,
    names: Mapping[str, str] | None = None,
    onnx_external_threshold: int | None = None,
    generation: Generation | None = None,
    progress: Callable[[str], None] | None = None,
    profiled: dict[str, profiling.Subject] | None = None,
    quantizing: Quantizing | None = None,
    budget_s: float | None = None,
) -> TargetResult:
    """Convert, load and verify one target; the result says how it went.

    Args:
        name: `onnx`, `aoti` or `executorch`.
        program: the final program (the one saved as program.pt2).
        traced: the program before `run_decompositions` (ExecuTorch lowers from it:
            XNNPACK delegates more of it, linear stays linear; ONNX converts it when it
            has ops ONNX runs natively: LSTM, GRU, RNN, attention).
        pristine: the eager module, never run itself (verification deep-copies it).
        args, kwargs: the example inputs the program was exported with.
        out_dir: where the artifact is written, under its name in `TARGET_ARTIFACTS`.
        options: the export's options (`aoti`, `onnx`, `verify`).
        names: the user's dim names for torch's symbols (`engine.shapes.dim_names`): the
            verification samples and the ONNX model's dims carry them.
        onnx_external_threshold: bytes of weights above which `onnx.external_data: auto`
            writes `model.onnx.data` (default `onnx.EXTERNAL_DATA_THRESHOLD`).
        generation: for a generation-ready program (a static KV cache): the artifact is
            also checked by greedy generation (`TargetResult.generation`); `onnx` is then
            traced with the cache as inputs and outputs (`engine.generation.onnx_past`)
            and checked by generation only.
        progress: told `"loading"` once the artifact is written and `"verifying"` once
            it is loaded (the pipeline turns them into the stage's progress fraction).
        profiled: when given, a succeeded target adds itself, loaded as it was verified
            (`engine.profile.profiling.target_subject`), for the profiling stage.
        quantizing: option `quantize`: the artifact is quantized, verified against the
            float eager model within the accuracy budget, and its accuracy is added to
            `quantizing.report` (a budget missed fails verification, not the target).
        budget_s: the seconds it may take, all of it (`engine.targets.time_budget.limit`); over
            them it fails (`target_failed`, `details.reason` `timeout`), its files removed.
    """
    path = out_dir / TARGET_ARTIFACTS[name]
    facts: dict[str, Any] = {}
    notes: list[str] = []
    check: VerificationReport | None = None
    encoder_check: VerificationReport | None = None
    generated: GenerationCheck | None = None
    encoder = generation.encoder if generation is not None else None
    encoder_files: list[Path] = []
    started = time.perf_counter()
    duration: float | None = None
    phase = ["converting"]  # what it was doing when its budget ran out

    def told(what: str) -> None:
        phase[0] = what
        if progress is not None:
            progress(what)

    try:
        with time_budget.limit(budget_s):
            absent = missing(name)
            if absent:
                raise TargetError(
                    f"{name}: this worker lacks {', '.join(absent)}",
                    hint=INSTALL_HINTS[name],
                    details={"missing": absent},
                )
            if quantizing is not None and not takes(name, quantizing.scheme):
                message, hint, details = refusal(name, quantizing.scheme)
                raise TargetError(message, hint=hint, details=details)
            target = _module(name)
            source = traced if name == "executorch" else program
            if quantizing is not None and name in ("executorch", "aoti"):
                source = quantizing.program(name)
            settings = _settings(name, options, program, pristine, args, kwargs, names)
            if onnx_external_threshold is not None and name == "onnx":
                settings["external_threshold"] = onnx_external_threshold
            with_past = None
            if generation is not None and name == "onnx":
                with_past = onnx_past.past_program(generation)
                settings["metadata"]["torchport.task"] = with_past.task
                source, args, kwargs = with_past.program, (), with_past.kwargs
                settings.update(
                    input_names=with_past.input_names,
                    output_names=with_past.output_names,
                    dim_names=with_past.dim_names,
                )
            if name == "onnx" and with_past is None:  # its native ops (onnx.convert)
                settings["undecomposed"] = traced
            if generation is not None and name == "executorch":
                settings["constant_methods"] = generation.runner_metadata()
                if encoder is not None:
                    settings.update(encoders.executorch_settings(encoder))
            target.convert(source, args, kwargs, path, facts=facts, **settings)
            if quantizing is not None and name == "onnx":
                from engine.quantization import onnx_runtime

                onnx_runtime.quantize(
                    path,
                    dynamic=quantizing.scheme == "int8_dynamic",
                    input_names=facts.get("inputs") or [],
                    calibration=[((), with_past.kwargs)] if with_past else quantizing.calibration,
                    accept=quantizing.accepts_outputs,
                    fallbacks=quantizing.fallbacks.setdefault(name, []),
                )
            told("loading")
            flat = target.load(path, source, **_loading(name, settings, facts))
            told("verifying")
            encoder_flat = None
            if encoder is not None:
                encoder_flat, encoder_files = encoders.convert(
                    name, target, encoder, path, settings, facts
                )
            duration = time.perf_counter() - started
            own = target.notes(facts)
            notes += own
            if not options.verify.enabled:
                check = VerificationReport(enabled=False)
                notes.append("not verified: verify.enabled is false")
            elif with_past is not None:
                notes.append(
                    "verified by generation only: model.onnx takes the KV cache as inputs and "
                    "returns it, a program of its own beside program.pt2"
                )
            elif quantizing is not None:
                samples = 0 if generation is not None else options.verify.samples
                check, measured = accuracy.measure(
                    structured_runner(flat, program),
                    program,
                    pristine,
                    args,
                    kwargs,
                    quantizing.options,
                    samples=samples,
                    names=names,
                )
                assert quantizing.report is not None
                quantizing.report.targets[name] = measured.model_copy(
                    update={"method": quantizing.method(name)}
                )
            else:
                tolerances = _tolerances(name, options)
                if generation is not None:  # the example's prefill, then generation
                    tolerances = tolerances.model_copy(update={"samples": 0})
                check = verification.verify(
                    program,
                    pristine,
                    args,
                    kwargs,
                    tolerances,
                    runner=structured_runner(flat, program),
                    names=names,
                    memory_mb=options.memory_mb,
                )
            if check is not None and check.passed is False:
                raised, where = failures.first_failure(check)
                kept = None
                if raised and options.target_range == "verified" and quantizing is None:
                    kept = failures.narrowed(check, name)
                if kept is not None:  # kept for the range it ran: the refusals are skipped
                    check, facts["verified_range"] = kept
                    notes[: len(own)] = target.notes(facts)
                elif raised:
                    refused = failures.refusal(
                        name, path.name, check, where, getattr(target, "bound", None)
                    )
                    facts["verified_range"] = refused.details.get("verified_range", {})
                    notes[: len(own)] = target.notes(facts)
                    raise refused
                elif quantizing is None:  # else outside the budget: `quantization_inaccurate`
                    raise TargetError(
                        f"{path.name} does not match eager PyTorch {where}",
                        hint=f"Look at targets.{name}.verification; raise verify.atol/rtol if the "
                        "difference is numerical noise of this runtime's kernels.",
                    )
            if encoder is not None and encoder_flat is not None and options.verify.enabled:
                encoder_check = encoders.verify(encoder, encoder_flat, _tolerances(name, options))
                if encoder_check.passed is False:
                    _, where = failures.first_failure(encoder_check)
                    raise TargetError(
                        f"the {name} encoder does not match the eager encoder {where}",
                        hint=f"Look at targets.{name}.encoder; raise verify.atol/rtol if the "
                        "difference is numerical noise of this runtime's kernels.",
                        details={"program": "encoder"},
                    )
            if options.verify.enabled and generation is not None:
                generated = _generation_check(flat, generation, with_past, encoder_flat)
                if quantizing is not None:
                    accuracy.record_tokens(quantizing.report, name, generated)
                elif not generated.passed:
                    raise TargetError(
                        f"{path.name} generates other tokens than eager transformers "
                        + mismatch_text(generated),
                        hint=f"See targets.{name}.generation for both token lists.",
                        details={"reason": "generation_mismatch", **mismatch_details(generated)},
                    )
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
            notes=notes,
            details=facts,
            error=(
                failures.timeout(name, budget_s or 0.0, phase=phase[0])
                if isinstance(exc, time_budget.TargetTimeout)
                else failures.error(name, exc)
            ),
        )
    if profiled is not None:
        profiled[name] = profiling.target_subject(
            name,
            target,
            path,
            source,
            _loading(name, settings, facts),
            args,
            kwargs,
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
        notes=notes,
        details=facts,
    )


def _generation_check(
    flat: FlatRunner,
    generation: Generation,
    with_past: onnx_past.PastProgram | None,
    encoder_flat: FlatRunner | None,
) -> GenerationCheck:
    if with_past is None:
        return runner_check(flat, generation, encoder_flat)
    return onnx_check(flat, with_past, generation, encoder_flat)


def skipped(reason: str) -> TargetResult:
    """A target not attempted, and why."""
    return TargetResult(status="skipped", notes=[reason])


FLOAT16_TOLERANCE = (1e-2, 1e-2)
"""(atol, rtol) a float16 ONNX model is verified with when verify.atol/rtol are unset."""


def _settings(
    name: str,
    options: ExportOptions,
    program: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    names: Mapping[str, str] | None,
) -> dict[str, Any]:
    if name == "aoti":
        return {"isa": options.aoti.isa}
    if name != "onnx":
        return {}
    from engine.targets import onnx_names

    metadata = {"torchport.version": __version__}
    task = onnx_names.task(pristine)
    if task is not None:
        metadata["torchport.task"] = task
    return {
        "input_names": onnx_names.input_names(pristine.forward, args, kwargs),
        "output_names": onnx_names.output_names(program.call_spec.out_spec),
        "dim_names": names,
        "metadata": metadata,
        "opset": options.onnx.opset,
        "dtype": options.onnx.dtype,
        "external_data": options.onnx.external_data,
    }


def _loading(name: str, settings: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    if name == "onnx":
        # The names the model has (a clash may have suffixed one): fed and fetched by name.
        wanted = settings["output_names"]
        outputs = facts.get("outputs") or []
        return {
            "input_names": facts.get("inputs"),
            "output_names": outputs[len(outputs) - len(wanted) :] if wanted else None,
            "refuse_empty": bool(facts.get("recurrent_nodes")),
        }
    return {key: value for key, value in settings.items() if key in ("isa", "method")}


def _tolerances(name: str, options: ExportOptions) -> VerifyOptions:
    opts = options.verify
    if name != "onnx" or options.onnx.dtype != "float16":
        return opts
    atol, rtol = FLOAT16_TOLERANCE
    return opts.model_copy(
        update={
            "atol": atol if opts.atol is None else opts.atol,
            "rtol": rtol if opts.rtol is None else opts.rtol,
        }
    )


def _files(name: str, path: Path) -> list[Path]:
    """The artifact and the files a target may write beside it (not the encoder's)."""
    own = set(TARGET_COMPANIONS.get(name, ())) - set(_encoder_names(name))
    return [path, *(path.with_name(extra) for extra in sorted(own))]


def _encoder_names(name: str) -> list[str]:
    encoder = encoders.ENCODER_FILES.get(name)
    return [] if encoder is None else [encoder, encoder + ".data"]


def _encoder_files(name: str, path: Path) -> list[Path]:
    return [path.with_name(each) for each in _encoder_names(name)]
