"""One export, end to end: load → trace → decompose → verify → serialize.

`run_export` never raises for a failure the user can cause: it always writes
`report.json` (with the error) into the output directory, and on success also
`program.pt2`, `graph.json` and `signature.json`.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from engine import (
    decomposition,
    diagnostics,
    documents,
    draft,
    dynamic_shapes,
    environment,
    inputs,
    loading,
    portability,
    roundtrip,
    tracing,
    verification,
)
from engine.artifacts import GRAPH, PROGRAM, REPORT, SIGNATURE, TARGET_ARTIFACTS, artifact_info
from engine.errors import (
    ExportError,
    InternalError,
    SerializationFailed,
    TargetFailed,
    VerificationFailed,
)
from engine.model import LoadedModel, Upload
from engine.source_map import SourceMap
from schemas import (
    ErrorBody,
    ExportOptions,
    Progress,
    ReportDocument,
    ReportWarning,
    RoundtripCheck,
    StageRecord,
    TargetResult,
    TracingReport,
    dynamic_shapes_adapter,
)

ProgressCallback = Callable[[Progress], None]
RoundtripRunner = Callable[[Path, Path], RoundtripCheck]
RoundtripPrefetch = Callable[[Path], None]


@dataclass(frozen=True)
class ExportRequest:
    """What to export and where: artifacts go to `out_dir`, scratch files to `work_dir`."""

    upload: Upload
    options: ExportOptions
    out_dir: Path
    work_dir: Path
    digest_artifacts: bool = True
    """List the artifacts, with their SHA-256, in the report. The sandbox's job child
    says no: the worker hashes the files it accepts from the child and lists them
    itself (reading a big program twice is 3 ms for a transformer block's 3.4 MB)."""


@dataclass
class ExportResult:
    """The report (always) and the artifacts written, by name."""

    report: ReportDocument
    artifacts: dict[str, Path] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        """Whether the export produced a verified program."""
        return self.report.status == "succeeded"


class _Run:
    """Bookkeeping of one export: stage timings, progress, the pieces of the report."""

    def __init__(self, request: ExportRequest, progress: ProgressCallback | None) -> None:
        self.request = request
        self.progress = progress
        self.stages: list[StageRecord] = []
        self.warnings: list[ReportWarning] = []
        self.sections: dict[str, Any] = {"tracing": TracingReport()}
        self.stage: str = "loading"
        self.source_map = SourceMap(request.work_dir / "src")
        self.libraries: dict[str, str] = {}
        """What the upload imported, for the report's environment (filled by loading)."""
        self.targets: dict[str, TargetResult] = {}
        """Each deployment target converted so far (option `targets`)."""

    def emit(self, fraction: float, message: str = "") -> None:
        if self.progress is not None:
            self.progress(Progress(stage=self.stage, fraction=fraction, message=message))

    @contextmanager
    def step(self, name: str, message: str) -> Iterator[None]:
        self.stage = name
        self.emit(0.0, message)
        started = time.perf_counter()
        try:
            yield
        except BaseException:
            self.stages.append(
                StageRecord(
                    name=name,
                    status="failed",
                    duration_s=time.perf_counter() - started,
                )
            )
            raise
        self.stages.append(
            StageRecord(
                name=name,
                status="succeeded",
                duration_s=time.perf_counter() - started,
            )
        )
        self.emit(1.0, f"{name} done")


def run_export(
    request: ExportRequest,
    *,
    progress: ProgressCallback | None = None,
    roundtrip_runner: RoundtripRunner | None = None,
    roundtrip_prefetch: RoundtripPrefetch | None = None,
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
    """
    started = time.perf_counter()
    request.out_dir.mkdir(parents=True, exist_ok=True)
    request.work_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(request, progress)
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
        for name in (PROGRAM, GRAPH, SIGNATURE, *TARGET_ARTIFACTS.values()):
            (request.out_dir / name).unlink(missing_ok=True)
            artifacts.pop(name, None)
    for name in request.options.targets:
        if name not in run.targets:
            run.targets[name] = TargetResult(
                status="skipped", notes=["The export failed before this target was converted."]
            )
    report = ReportDocument(
        status="failed" if error else "succeeded",
        stages=run.stages,
        tracing=run.sections["tracing"],
        decomposition=run.sections.get("decomposition"),
        verification=run.sections.get("verification"),
        model=run.sections.get("model"),
        inputs=run.sections.get("inputs", []),
        warnings=run.warnings,
        error=error,
        draft_export=run.sections.get("draft_export"),
        targets=run.targets,
        environment=environment.describe(request.options.device, libraries=run.libraries),
        artifacts=(
            [artifact_info(path) for path in artifacts.values()] if request.digest_artifacts else []
        ),
        duration_s=time.perf_counter() - started,
    )
    report_path = request.out_dir / REPORT
    report_path.write_text(report.model_dump_json(indent=2))
    artifacts[REPORT] = report_path
    return ExportResult(report=report, artifacts=artifacts)


def _export(
    run: _Run,
    artifacts: dict[str, Path],
    roundtrip_runner: RoundtripRunner,
    roundtrip_prefetch: RoundtripPrefetch | None = None,
) -> None:
    request, options = run.request, run.request.options
    reference = options.verify.enabled
    with run.step("loading", "importing the uploaded module"):
        loaded = loading.load(
            request.upload, options, request.work_dir, reference=False, libraries=run.libraries
        )
        # Before the eager run and portability wrapping: the inputs as the user gave them,
        # in the report even when the model then fails (the dynamic-shapes editor needs them).
        run.sections["inputs"] = inputs.summarize_inputs(
            loaded.module.forward, loaded.args, loaded.kwargs
        )
        # Without verification nothing needs the eager reference up front; it is run
        # later only to explain a tracing failure or to map non-portable outputs.
        if reference:
            _run_reference(loaded)
        made = _make_portable(run, loaded)
        pristine = copy.deepcopy(loaded.module) if reference else loaded.module

    with run.step("tracing", "torch.export.export"):
        if options.dynamic_shapes is not None:
            spec: Any = _plain(options.dynamic_shapes)
            source = "options"
        elif loaded.module_dynamic_shapes is not None:
            spec, source = loaded.module_dynamic_shapes, "module"
        else:
            spec, source = None, "none"
        traced: tracing.Traced | None = None
        for retry in (False, True):
            try:
                traced = tracing.trace(loaded, options, spec, source)
                break
            except ExportError as exc:
                run.sections["tracing"] = getattr(exc, "tracing_report", run.sections["tracing"])
                _suggest_dynamic_shapes(run, source)
                if not reference and exc.code != "invalid_request":
                    _run_reference(loaded)  # a model that fails eagerly: say that instead
                    if not retry and not made.mapping.wrapped and _unknown_output(exc):
                        # an output object pytree does not know (a KV cache): wrap, retry
                        made = _make_portable(run, loaded)
                        if made.mapping.wrapped:
                            continue
                if options.draft_report and exc.code in DRAFT_WORTHY:
                    run.sections["draft_export"] = _draft(loaded, spec, source)
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
            _run_reference(loaded)
            made = _make_portable(run, loaded)
            if made.mapping.wrapped:
                traced = tracing.trace(loaded, options, spec, source)
        run.sections["tracing"] = traced.report
        _suggest_dynamic_shapes(run, source)
        run.warnings.extend(traced.warnings)
        applied = traced.report.dynamic_shapes.applied

    with run.step("decomposing", f"run_decompositions ({options.decomposition.mode})"):
        decomposed = decomposition.decompose(
            traced.ep, options.decomposition, source_map=loaded.source_map
        )
        run.sections["decomposition"] = decomposed.report
        run.warnings.extend(decomposed.warnings)
        ep = decomposed.ep
        run.sections["model"] = documents.model_summary(ep)

    if options.verify.enabled:
        with run.step("verifying", "comparing against eager PyTorch"):
            checked = verification.verify(ep, pristine, loaded.args, loaded.kwargs, options.verify)
            undecomposed_passed: bool | None = None
            if checked.passed is False:
                recovered, undecomposed_passed = _keep_ops_until_verified(
                    run, traced.ep, decomposed, checked, loaded, pristine
                )
                if recovered is not None:
                    ep, checked = recovered
            run.sections["verification"] = checked
            if checked.passed is False:
                raise _verification_failed(checked, undecomposed_passed)

    with run.step("serializing", "torch.export.save"):
        program = request.out_dir / PROGRAM
        try:
            torch.export.save(ep, program)
        except Exception as exc:
            raise SerializationFailed(
                f"torch.export.save failed: {type(exc).__name__}: {exc}",
                hint="Check for constants or custom objects in the model that torch cannot "
                "serialize.",
                details={"exception": type(exc).__name__},
            ) from exc
        artifacts[PROGRAM] = program
        roundtrip_wanted = options.verify.enabled and options.verify.roundtrip
        if roundtrip_wanted and roundtrip_prefetch is not None:
            roundtrip_prefetch(program)
        _write_json(
            request.out_dir / GRAPH, documents.graph_document(ep, loaded.source_map), artifacts
        )
        signature = documents.signature_document(
            ep,
            args=loaded.args,
            kwargs=loaded.kwargs,
            dynamic_shapes_json=applied,
            portability=made.mapping,
        )
        _write_json(request.out_dir / SIGNATURE, signature, artifacts)
        if roundtrip_wanted:
            _check_roundtrip(run, ep, loaded, program, roundtrip_runner)

    if options.targets:
        _convert(run, artifacts, ep, traced.ep, pristine, loaded)


def _convert(
    run: _Run,
    artifacts: dict[str, Path],
    ep: torch.export.ExportedProgram,
    traced: torch.export.ExportedProgram,
    pristine: torch.nn.Module,
    loaded: LoadedModel,
) -> None:
    """The deployment targets asked for, each converted from the job's own programs and
    verified in its runtime; a failed one is a `target_failed` warning, or the job's
    error when `targets_required`."""
    from engine import targets

    options = run.request.options
    wanted = [name for name in targets.ORDER if name in options.targets]
    with run.step("converting", ", ".join(wanted)):
        for index, name in enumerate(wanted):
            run.emit(index / len(wanted), f"{name}: converting and verifying")
            result = targets.run_target(
                name,
                program=ep,
                traced=traced,
                pristine=pristine,
                args=loaded.args,
                kwargs=loaded.kwargs,
                out_dir=run.request.out_dir,
                options=options,
            )
            run.targets[name] = result
            if result.status == "succeeded" and result.artifact is not None:
                artifacts[result.artifact] = run.request.out_dir / result.artifact
                continue
            error = result.error
            message = error.message if error is not None else f"target {name} failed"
            details = {**(error.details if error is not None else {}), "target": name}
            if options.targets_required:
                raise TargetFailed(
                    message, hint=error.hint if error is not None else None, details=details
                )
            run.warnings.append(
                ReportWarning(code="target_failed", message=message, details=details)
            )


def _make_portable(run: _Run, loaded: LoadedModel) -> portability.Portable:
    made = portability.make_portable(
        loaded.module,
        loaded.args,
        loaded.kwargs,
        loaded.eager_outputs,
        keep_types=not run.request.options.portable,
    )
    run.warnings.extend(made.warnings)
    loaded.module, loaded.args, loaded.kwargs = made.module, made.args, made.kwargs
    return made


def _keep_ops_until_verified(
    run: _Run,
    traced: torch.export.ExportedProgram,
    decomposed: decomposition.Decomposed,
    checked: Any,
    loaded: LoadedModel,
    pristine: torch.nn.Module,
) -> tuple[tuple[torch.export.ExportedProgram, Any] | None, bool | None]:
    """The decomposed program failed verification: when the traced one passes, keep the
    fewest ops undecomposed that make it pass (`decomposition.keep_until_verified`).

    Returns the program and its verification report (None when nothing was kept), and
    whether the program before decomposition passed (None: not checked).
    """
    opts = run.request.options
    if opts.decomposition.mode == "none" or not opts.decomposition.keep_failing_ops:
        return None, None
    args, kwargs = loaded.args, loaded.kwargs
    if not verification.verify(traced, pristine, args, kwargs, opts.verify).passed:
        return None, False  # the decomposition is not what breaks it
    reports: dict[int, Any] = {}

    def passes(trial: torch.export.ExportedProgram) -> bool:
        reports[id(trial)] = verification.verify(trial, pristine, args, kwargs, opts.verify)
        return reports[id(trial)].passed is True

    failure = _first_failure(checked)
    reason = failure.get("reason") or (
        f"{failure.get('output')} differs by {failure.get('max_abs_error')}"
        if failure.get("output")
        else "verification failed"
    )
    kept = decomposition.keep_until_verified(
        traced, opts.decomposition, decomposed, passes, failure=reason, example=(args, kwargs)
    )
    if kept is None:
        return None, True
    run.sections["decomposition"] = kept.report
    run.sections["model"] = documents.model_summary(kept.ep)
    run.warnings[:] = [w for w in run.warnings if w not in decomposed.warnings]
    run.warnings.extend(kept.warnings)
    return (kept.ep, reports[id(kept.ep)]), True


def _verification_failed(checked: Any, undecomposed_passed: bool | None) -> VerificationFailed:
    details = _first_failure(checked)
    reason = str(details.get("reason") or "")
    if reason.startswith(verification.EXPORTED_RAISED):
        message = (
            f"The exported program raised on sample {details['sample']!r}: "
            + reason[len(verification.EXPORTED_RAISED) :]
        )
    else:
        message = "The exported program's outputs differ from eager PyTorch beyond the tolerance."
    hint = (
        "Look at the verification table; raise verify.atol/rtol if the difference is "
        "numerical noise, or check for randomness or state the export did not capture."
    )
    if undecomposed_passed:
        details["undecomposed_passed"] = True
        hint = (
            "The program before decomposition passed and no set of ops kept undecomposed "
            'fixed it: use decomposition.mode "none", or preserve the ops involved.'
        )
    return VerificationFailed(message, hint=hint, details=details)


def _suggest_dynamic_shapes(run: _Run, source: str) -> None:
    """Propose a spec in the report when the export had none (from the inputs alone)."""
    if source == "none":
        suggested = dynamic_shapes.suggest_spec(run.sections.get("inputs", []))
        if suggested is not None:
            run.sections[
                "tracing"
            ].dynamic_shapes.suggested = dynamic_shapes_adapter.validate_python(suggested)


def _unknown_output(exc: ExportError) -> bool:
    """Whether tracing failed on an output of a type pytree does not know."""
    text = f"{exc} {exc.__cause__}"
    return "in output, which is not a known type" in text


def _run_reference(loaded: LoadedModel) -> None:
    """The eager reference run, when load did not do it; raises `eager_run_failed`."""
    if loaded.eager_outputs is None:
        loaded.eager_outputs, loaded.eager_buffers = loading.run_eager(
            loaded.module, loaded.args, loaded.kwargs, loaded.source_map
        )


DRAFT_WORTHY = frozenset(
    {"data_dependent", "dynamic_shape_violation", "missing_fake_kernel", "unsupported_python"}
)
"""Tracing failures after which draft export finds more (and every) issue."""


def _draft(loaded: LoadedModel, spec: Any, source: str) -> list[Any]:
    """draft_export's issue list; non-strict, since strict drafts stop at graph breaks."""
    if source == "options":
        try:
            spec = dynamic_shapes.to_torch(spec, loaded.module, loaded.args, loaded.kwargs)
        except ExportError:
            spec = None
    return draft.draft_issues(loaded, spec, strict=False)


def _check_roundtrip(
    run: _Run,
    ep: torch.export.ExportedProgram,
    loaded: LoadedModel,
    program: Path,
    runner: RoundtripRunner,
) -> None:
    payload = run.request.work_dir / "roundtrip-payload.pt"
    with torch.no_grad():
        expected = ep.module()(*copy.deepcopy(loaded.args), **copy.deepcopy(loaded.kwargs))
    roundtrip.write_payload(payload, loaded.args, loaded.kwargs, expected)
    check = runner(program, payload)
    verification_report = run.sections.get("verification")
    if verification_report is not None:
        verification_report.roundtrip = check
    if check.status == "failed":
        raise SerializationFailed(
            "The saved program.pt2 did not load and run the same in a fresh process: "
            + (check.reason or "outputs differ"),
            hint="A deployment loading this file would fail the same way. Keep inputs and "
            "outputs to tensors and plain containers (leave `portable` on).",
            details={"bitwise_equal": check.bitwise_equal, "reason": check.reason},
        )


def _finish_error(run: _Run, exc: ExportError) -> ErrorBody:
    if exc.stage is None:
        exc.stage = run.stage
    exc = diagnostics.limit_reached(exc) or exc
    body = exc.to_body()
    if isinstance(exc, InternalError):
        body.message = run.source_map.scrub(body.message)
    return body


QUIET_CATEGORIES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning, ResourceWarning)
"""Deprecation notices from torch's internals, and ResourceWarnings (an unclosed file or
socket anywhere in the process, reported whenever the garbage collector happens to run
during the export): nothing a user can act on. The user's own warnings are always
reported, whatever their category."""

MAX_TORCH_WARNINGS = 20


def _torch_warnings(
    caught: list[warnings.WarningMessage], source_map: SourceMap
) -> list[ReportWarning]:
    """Warnings raised while exporting, once each, with the user's file when it was theirs."""
    seen: dict[str, ReportWarning] = {}
    for item in caught:
        text = source_map.scrub(str(item.message)).strip()
        if not text or text in seen or len(seen) >= MAX_TORCH_WARNINGS:
            continue
        location = source_map.location(item.filename, item.lineno)
        if location is None and issubclass(item.category, QUIET_CATEGORIES):
            continue
        details: dict[str, Any] = {"category": item.category.__name__}
        if location is not None:
            details["location"] = location.model_dump()
        seen[text] = ReportWarning(code="torch_warning", message=text, details=details)
    return list(seen.values())


def _first_failure(checked: Any) -> dict[str, Any]:
    for sample in checked.samples:
        if sample.status == "failed" and not any(
            not out.passed for out in [*sample.outputs, *sample.buffers]
        ):
            return {"sample": sample.label, "reason": sample.reason}
        for out in [*sample.outputs, *sample.buffers]:
            if not out.passed:
                return {
                    "sample": sample.label,
                    "output": out.path,
                    "max_abs_error": out.max_abs_error,
                    "max_rel_error": out.max_rel_error,
                    "atol": out.atol,
                    "rtol": out.rtol,
                }
    return {}


def _plain(spec: Any) -> Any:
    """The JSON form of an options value that may hold pydantic models."""
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json", exclude_none=True)
    if isinstance(spec, dict):
        return {key: _plain(value) for key, value in spec.items()}
    if isinstance(spec, list):
        return [_plain(value) for value in spec]
    return spec


def _write_json(path: Path, document: BaseModel, artifacts: dict[str, Path]) -> None:
    path.write_text(document.model_dump_json(indent=2))
    artifacts[path.name] = path


def warm_up(work_dir: Path) -> None:
    """Run one tiny export so that later exports in this process (or its forks) start warm.

    Only tiny shapes and no eager kernels on real data: a process that has started
    torch's intra-op thread pool cannot be forked safely.
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
