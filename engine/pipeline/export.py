"""One export, end to end: load → trace → decompose → verify → serialize (→ convert →
profile, when asked).

`run_export` never raises for a failure the user can cause: it always writes
`report.json` (with the error) into the output directory, and on success also
`program.pt2`, `graph.json` and `signature.json`.

The bookkeeping of a run lives in `engine.pipeline.run_state`, the steps around the stages
(portability, recovery, round trip) in `engine.pipeline.steps`, the stages after
serializing (targets, profiles) in `engine.pipeline.target_stages`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from engine import generation
from engine.decompose import cia_ops, decomposition
from engine.diagnostics import classification as diagnostics
from engine.diagnostics.source_map import SourceMap
from engine.errors import ExportError, InternalError
from engine.load import inputs, loading, module_copies
from engine.load.checkpoint import tokenizer
from engine.load.model import LoadedModel
from engine.pipeline import encoder_program
from engine.pipeline.request import (
    ExportRequest,
    ExportResult,
    ProgressCallback,
    ReportHook,
    RoundtripDrop,
    RoundtripPrefetch,
    RoundtripRunner,
)
from engine.pipeline.run_state import MAX_TORCH_WARNINGS, QUIET_CATEGORIES, ExportRun
from engine.pipeline.run_state import torch_warnings as _torch_warnings
from engine.pipeline.steps import (
    DRAFT_WORTHY,
    apply_portability,
    check_roundtrip,
    draft_section,
    keep_ops_until_verified,
    partial_verification_warning,
    plain_options,
    run_reference,
    suggest_dynamic_shapes,
    unknown_output,
    verification_failed,
    write_json,
)
from engine.pipeline.target_stages import convert_targets, profile_artifacts
from engine.profile import profiling
from engine.quantization import calibration
from engine.serialize import documents, portability, roundtrip
from engine.serialize.artifacts import (
    CRASH_REPORT,
    GRAPH,
    PROGRAM,
    PROVISIONAL_REPORT,
    REPORT,
    SIGNATURE,
)
from engine.serialize.program_save import EarlySave, save_program
from engine.shapes.dim_names import dim_names
from engine.targets.registry import TARGET_FILES
from engine.trace import library_adaptations, tracing
from engine.verify import verification
from schemas import (
    EncoderReport,
    ErrorBody,
    ExportOptions,
    RoundtripCheck,
    TargetResult,
    VerifyOptions,
)
from schemas.model_zip import TOKENIZER_FILES

__all__ = [
    "DRAFT_WORTHY",
    "MAX_TORCH_WARNINGS",
    "QUIET_CATEGORIES",
    "ExportRequest",
    "ExportResult",
    "ProgressCallback",
    "ReportHook",
    "RoundtripDrop",
    "RoundtripPrefetch",
    "RoundtripRunner",
    "run_export",
    "warm_up",
]


def run_export(
    request: ExportRequest,
    *,
    progress: ProgressCallback | None = None,
    roundtrip_runner: RoundtripRunner | None = None,
    roundtrip_prefetch: RoundtripPrefetch | None = None,
    roundtrip_drop: RoundtripDrop | None = None,
    finish_report: ReportHook | None = None,
) -> ExportResult:
    """Export the uploaded model; the report says how it went, whatever happened.

    Args:
        request: the upload, the options and the two directories.
        progress: called at the start and end of every stage.
        roundtrip_runner: loads the saved program in a fresh torch-only process and
            runs it; defaults to a subprocess. The sandbox passes its own.
        roundtrip_prefetch: told the program's path as soon as it is saved, before the
            graph and signature documents and the payload are written, so that a loader
            in another process can load it meanwhile (the sandbox's does); optional.
        roundtrip_drop: stops the loader told of a program by `roundtrip_prefetch`
            (the next prefetch or run starts afresh). Given with a prefetch, the program
            is saved at the start of verification, and loaded while verification runs
            (engine.serialize.program_save.EarlySave); optional.
        finish_report: given the report before it is written, to add what only the
            caller knows (the sandbox's job child: attempts it saw); `report.json` is
            written once, after it.
    """
    request.out_dir.mkdir(parents=True, exist_ok=True)
    request.work_dir.mkdir(parents=True, exist_ok=True)
    run = ExportRun(request, progress)
    artifacts: dict[str, Path] = {}
    error: ErrorBody | None = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            # "default" reports each warning once per code location and answers repeats
            # from the registry; "always" or message filters cost ~15% on big graphs.
            warnings.simplefilter("default")
            try:
                _export(
                    run,
                    artifacts,
                    roundtrip_runner or roundtrip.run_in_subprocess,
                    roundtrip_prefetch,
                    roundtrip_drop,
                )
            finally:
                run.warnings.extend(_torch_warnings(caught, run.source_map))
    except ExportError as exc:
        error = _finish_error(run, exc)
    except Exception as exc:  # classified once, in diagnostics
        error = _finish_error(
            run, diagnostics.classify(exc, stage=run.stage, source_map=run.source_map)
        )
    if error is not None:
        made = (PROGRAM, GRAPH, SIGNATURE, encoder_program.ENCODER_PROGRAM, *TARGET_FILES)
        for name in (*made, *TOKENIZER_FILES):
            (request.out_dir / name).unlink(missing_ok=True)
            artifacts.pop(name, None)
    for name in request.options.targets:
        if name not in run.targets:
            run.targets[name] = TargetResult(
                status="skipped", notes=["The export failed before this target was converted."]
            )
    report = run.report(error, artifacts)
    if finish_report is not None:
        finish_report(report)
    report = write_json(request.out_dir / REPORT, report, artifacts)
    for provisional in (PROVISIONAL_REPORT, CRASH_REPORT):  # report.json says it all
        (request.out_dir / provisional).unlink(missing_ok=True)
    return ExportResult(report=report, artifacts=artifacts)


def _export(
    run: ExportRun,
    artifacts: dict[str, Path],
    roundtrip_runner: RoundtripRunner,
    roundtrip_prefetch: RoundtripPrefetch | None = None,
    roundtrip_drop: RoundtripDrop | None = None,
) -> None:
    request, options = run.request, run.request.options
    roundtrip_wanted = options.verify.enabled and options.verify.roundtrip
    program = request.out_dir / PROGRAM
    reference = options.verify.enabled
    with run.step("loading", "importing the uploaded module"):
        loaded = loading.load(
            request.upload, options, request.work_dir, reference=False, libraries=run.libraries
        )
        run.sections["checkpoint"] = loaded.checkpoint
        run.sections["weights"] = loaded.weights
        run.warnings.extend(loaded.warnings)
        if request.upload.calibration is not None:
            loaded.calibration = calibration.read(
                request.upload.calibration,
                (loaded.args, loaded.kwargs),
                options.quantize.scheme,
            )
        # Before the eager run and portability wrapping: the inputs as the user gave them,
        # in the report even when the model then fails (the dynamic-shapes editor needs them).
        run.sections["inputs"] = inputs.summarize_inputs(
            loaded.module.forward, loaded.args, loaded.kwargs
        )
        # Without verification nothing needs the eager reference up front; it is run
        # later only to explain a tracing failure or to map non-portable outputs.
        if reference:
            run_reference(loaded)
        made = apply_portability(run, loaded)
        # A copy sharing the weights (nothing before the targets writes them): buffers,
        # settings and structure as the user gave them, whatever tracing adapts below.
        pristine = module_copies.sharing_weights(loaded.module) if reference else loaded.module
        # after the copy: verification compares against the model as the user gave it
        traced_model = loaded.module
        if isinstance(traced_model, portability.PortableModule):
            traced_model = traced_model.original
        run.warnings.extend(library_adaptations.adapt_for_export(traced_model))

    with run.step("tracing", "torch.export.export"):
        if options.dynamic_shapes is not None:
            spec: Any = plain_options(options.dynamic_shapes)
            source = "options"
        elif loaded.module_dynamic_shapes is not None:
            spec, source = loaded.module_dynamic_shapes, loaded.dynamic_shapes_source
        else:
            spec, source = None, "none"
        traced: tracing.Traced | None = None
        for retry in (False, True):
            try:
                traced = tracing.trace(loaded, options, spec, source)
                break
            except ExportError as exc:
                run.sections["tracing"] = getattr(exc, "tracing_report", run.sections["tracing"])
                suggest_dynamic_shapes(run, source)
                if not reference and exc.code != "invalid_request":
                    run_reference(loaded)  # a model that fails eagerly: say that instead
                    if not retry and not made.mapping.wrapped and unknown_output(exc):
                        # an output object pytree does not know (a KV cache): wrap, retry
                        made = apply_portability(run, loaded)
                        if made.mapping.wrapped:
                            continue
                if options.draft_report and exc.code in DRAFT_WORTHY:
                    run.sections["draft_export"] = draft_section(loaded, spec, source)
                raise
        assert traced is not None  # the loop breaks with it or raises
        out_spec = traced.ep.call_spec.out_spec
        if (
            not reference
            and not made.mapping.wrapped
            and portability.non_portable_types_in_spec(out_spec)
        ):
            # Rare: outputs of types a torch-only loader lacks. Mapping them (or naming
            # them in the warning) needs real outputs.
            run_reference(loaded)
            made = apply_portability(run, loaded)
            if made.mapping.wrapped:
                traced = tracing.trace(loaded, options, spec, source)
        run.sections["tracing"] = traced.report
        suggest_dynamic_shapes(run, source)
        run.warnings.extend(traced.warnings)
        applied = traced.report.dynamic_shapes.applied
        encoder = loaded.generation.encoder if loaded.generation is not None else None
        encoder_report: EncoderReport | None = None
        if encoder is not None:  # an encoder-decoder model's second program
            run.emit(0.9, "the encoder: torch.export.export, run_decompositions")
            encoder_report = encoder_program.make(run, loaded, encoder)

    with run.step("decomposing", f"run_decompositions ({options.decomposition.mode})"):
        decomposed = decomposition.decompose(
            traced.ep, options.decomposition, source_map=loaded.source_map
        )
        run.sections["decomposition"] = decomposed.report
        run.warnings.extend(decomposed.warnings)
        ep = decomposed.ep
        names = dim_names(ep, traced.dynamic_shapes, loaded.module, loaded.args, loaded.kwargs)
        run.sections["model"] = documents.model_summary(ep, names)

    example_outputs: list[Any] = []  # the program's, kept for the round trip
    early: EarlySave | None = None
    if options.verify.enabled:
        with run.step("verifying", "comparing against eager PyTorch"):
            if roundtrip_wanted and roundtrip_prefetch is not None and roundtrip_drop is not None:
                run.emit(0.0, "saving program.pt2: a fresh process loads it meanwhile")
                early = EarlySave.begin(
                    ep,
                    program,
                    loaded.source_map,
                    prefetch=roundtrip_prefetch,
                    drop=roundtrip_drop,
                    encoder=encoder,
                )
                run.emit(0.1, "comparing against eager PyTorch")
            checked = verification.verify(
                ep,
                pristine,
                loaded.args,
                loaded.kwargs,
                _sampled(loaded, options),
                names=names,
                example_outputs=example_outputs,
                memory_mb=options.memory_mb,
            )
            undecomposed_passed: bool | None = None
            if checked.passed is False:
                recovered, undecomposed_passed = keep_ops_until_verified(
                    run, traced.ep, decomposed, checked, loaded, pristine, names
                )
                if recovered is not None:
                    ep, checked = recovered
                    example_outputs.clear()  # another program's
                    if early is not None:  # saved before the program changed
                        early.discard()
            run.sections["verification"] = checked
            if checked.passed is False:
                raise verification_failed(checked, undecomposed_passed)
            partial = partial_verification_warning(checked)
            if partial is not None:
                run.warnings.append(partial)
            if loaded.generation is not None:
                made_ready = generation.program_report(ep, loaded.generation, verify=False)
                made_ready.encoder = encoder_report
                run.sections["generation"] = made_ready
                if encoder is not None and encoder_report is not None:
                    run.emit(0.4, "the encoder against eager PyTorch")
                    encoder_report.verification = encoder_program.verify(encoder, options)
                    if encoder_report.verification.passed is False:
                        raise encoder_program.failed(encoder_report.verification)
                run.emit(0.5, "greedy generation against eager transformers")
                checked_ready = generation.program_report(ep, loaded.generation, verify=True)
                made_ready.check = checked_ready.check
                run.warnings.extend(generation.constant_warnings(made_ready.check))
                if made_ready.check is not None and not made_ready.check.passed:
                    raise generation.mismatch_error(made_ready.check)
    elif loaded.generation is not None:
        made_ready = generation.program_report(ep, loaded.generation, verify=False)
        made_ready.encoder = encoder_report
        run.sections["generation"] = made_ready

    with run.step("serializing", "torch.export.save"):
        save_s = early.save_s if early is not None else None
        if early is None or not early.saved:
            save_s = save_program(
                ep,
                program,
                loaded.source_map,
                check_ops=options.portable or roundtrip_wanted,
                encoder=encoder,
            )
            if roundtrip_wanted and roundtrip_prefetch is not None:
                roundtrip_prefetch(program)
        artifacts[PROGRAM] = program
        write_json(
            request.out_dir / GRAPH,
            documents.graph_document(ep, loaded.source_map, names),
            artifacts,
        )
        signature = documents.signature_document(
            ep,
            args=loaded.args,
            kwargs=loaded.kwargs,
            dynamic_shapes_json=applied,
            portability=made.mapping,
            names=names,
        )
        write_json(request.out_dir / SIGNATURE, signature, artifacts)
        if loaded.checkpoint is not None and loaded.checkpoint_dir is not None:
            tokenizer.write(
                loaded.checkpoint_dir, loaded.checkpoint.tokenizer_files, request.out_dir, artifacts
            )
        if roundtrip_wanted:

            def timed_runner(pt2: Path, payload: Path) -> RoundtripCheck:
                check = roundtrip_runner(pt2, payload)
                check.save_s = save_s  # in the report whether the round trip passes or not
                return check

            check_roundtrip(run, ep, loaded, program, timed_runner, example_outputs[:1] or None)
        if encoder is not None and encoder_report is not None:
            artifacts[encoder_program.ENCODER_PROGRAM] = encoder_program.save(
                run, encoder, encoder_report, roundtrip_runner if roundtrip_wanted else None
            )

    profiled: dict[str, profiling.Subject] | None = {} if profiling.wanted(options) else None
    if options.targets:
        convert_targets(
            run, artifacts, ep, traced.ep, pristine, loaded, names, profiled, traced.dynamic_shapes
        )
    if profiled is not None:
        profile_artifacts(run, artifacts, pristine, loaded, profiled)


def _sampled(loaded: LoadedModel, options: ExportOptions) -> VerifyOptions:
    """The verification options; a generation-ready program is checked on its example
    (a prefill) and then by generation: random samples would draw cache positions that
    no generation makes."""
    if loaded.generation is None:
        return options.verify
    return options.verify.model_copy(update={"samples": 0})


def _finish_error(run: ExportRun, exc: ExportError) -> ErrorBody:
    if exc.stage is None:
        exc.stage = run.stage
    exc = diagnostics.limit_reached(exc) or exc
    body = exc.to_body()
    if isinstance(exc, InternalError):
        body.message = run.source_map.scrub(body.message)
    checkpoint = run.sections.get("checkpoint")
    own_dims = body.code == "dynamic_shape_violation" and run.request.options.dynamic_shapes
    if (
        body.code in CODE_FIXES
        and checkpoint is not None
        and not checkpoint.remote_code
        and not own_dims
    ):
        body.hint = _library_code_hint(body.code)
        body.details = {**(body.details or {}), "library_code": True}
    return body


CODE_FIXES = frozenset(
    {"data_dependent", "unsupported_python", "missing_fake_kernel", "dynamic_shape_violation"}
)
"""Codes whose hint tells the user to change their model's code or their dims."""


def _library_code_hint(code: str) -> str:
    """The hint of a `CODE_FIXES` failure of a checkpoint whose code is transformers'
    own, which the user did not write and cannot change through the upload."""
    what = {
        "data_dependent": "branches or shapes on tensor values",
        "unsupported_python": "Python that torch.export cannot trace",
        "missing_fake_kernel": "an op without a shape function",
        "dynamic_shape_violation": "code that fixes the sizes of dims",
    }[code]
    return (
        f"This checkpoint's model code is transformers' own and has {what}: a limit of "
        "torch.export on this architecture as transformers writes it, not something in "
        "your checkpoint. Export it from model code instead (a .py that builds the model "
        "from the checkpoint and patches or wraps the part named in the location), with "
        "inputs and `dynamic_shapes` of your own; `report.draft_export` lists every issue "
        "torch found."
    )


def warm_up(work_dir: Path) -> None:
    """Run one tiny export so that later exports in this process (or its forks) start warm.

    Only tiny shapes and no eager kernels on real data: a process that has started
    torch's intra-op thread pool cannot be forked safely. Last, keeps torch's list of
    preservable CIA ops for later exports (engine.decompose.cia_ops): call it after the imports
    that register op namespaces (the zygote imports the model libraries first).
    """

    class _Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)) + 1

    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(
        _Tiny(), (torch.zeros(2, 2),), dynamic_shapes={"x": {0: batch}}, strict=False
    )
    ep = ep.run_decompositions()
    work_dir.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, work_dir / "warm-up.pt2")
    json.dumps(documents.graph_document(ep, SourceMap(work_dir)).model_dump(mode="json"))
    cia_ops.install()
