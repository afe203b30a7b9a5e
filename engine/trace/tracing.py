"""The tracing stage: `torch.export.export`, with strict-mode fallback and dynamic-shape fixes.

Each call of `torch.export.export` is one `TraceAttempt` of the report. With
`strict="auto"` the strict mode is tried first, then the non-strict one. With
`auto_fix_dynamic_shapes`, a constraint violation whose message carries suggested
fixes is retried with the fixes applied (at most `MAX_FIX_ROUNDS` times per mode);
fixes found in one mode carry over to the next.

A named dim declared dynamic whose example size is 1 would be specialized to 1 by
torch; such examples are widened first (`dynamic_shapes.widen_size_one_dims`) and the
trace warns `specialization_avoided`. When every attempt on the widened example fails,
the attempts are repeated on the user's own example.

Dims torchport chose for a checkpoint (source `checkpoint`) that the model's code refuses
(`dynamic_shape_violation` after the fixes) are its own fault, not the user's: the
checkpoint is traced again with only `batch_size` dynamic, then with none, with warning
`dims_made_static`, as a fix that pins a named dim to one size warns too.

On failure `trace` raises the classified error of the last attempt (via
`engine.diagnostics.classification.classify`, the one place that maps torch's exceptions) with the
report of every attempt attached as its `tracing_report` attribute, so the pipeline
can still write it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import ValidationError

from engine.diagnostics import classification as diagnostics
from engine.errors import ExportError
from engine.load.model import LoadedModel
from engine.shapes.examples import WIDENED_SIZE, Widened, widen_size_one_dims
from engine.shapes.grammar import plain_json, to_torch
from engine.shapes.json_form import apply_fixes, fix_to_json, suggested_fixes, to_json
from engine.shapes.structure import complete
from schemas import (
    DynamicShapeFix,
    DynamicShapesReport,
    ExportOptions,
    ReportWarning,
    TraceAttempt,
    TracingReport,
)

__all__ = ["MAX_FIX_ROUNDS", "Traced", "trace"]

MAX_FIX_ROUNDS = 3
"""How many times per mode the suggested fixes are applied before giving up."""

Source = Literal["options", "module", "checkpoint", "none"]


@dataclass
class Traced:
    """The exported program and how it was obtained."""

    ep: torch.export.ExportedProgram
    report: TracingReport
    warnings: list[ReportWarning] = field(default_factory=list)
    dynamic_shapes: Any = None
    """The spec in torch's form the program was traced with (fixes applied)."""


def trace(loaded: LoadedModel, options: ExportOptions, dynamic_shapes: Any, source: str) -> Traced:
    """Export `loaded.module` on its example inputs.

    Args:
        loaded: the model and its example inputs.
        options: `strict` (False, True or "auto"; `loaded.strict` overrides it) and
            `auto_fix_dynamic_shapes` are used.
        dynamic_shapes: the JSON spec when `source` is "options" or "checkpoint" (made
            for a checkpoint's task), the torch-form spec
            from the uploaded module when it is "module", None when "none".
        source: where `dynamic_shapes` came from.

    Returns:
        The program and the tracing report.

    Raises:
        ExportError: `InvalidRequest` for a spec that does not fit the inputs, otherwise
            the classified error of the last attempt; either way its `tracing_report`
            attribute holds the report.
    """
    state = _State(source=_source(source))
    try:
        spec = _torch_spec(loaded, dynamic_shapes, state)
    except ExportError as err:
        err.tracing_report = state.report()  # type: ignore[attr-defined]
        raise
    if loaded.strict is not None:  # the model prefers a mode (a static KV cache: non-strict)
        modes = [loaded.strict, not loaded.strict]
    else:
        modes = [True, False] if options.strict == "auto" else [bool(options.strict)]
    try:
        traced = _traced(loaded, options, spec, modes, state)
    except ExportError as error:
        if state.source != "checkpoint" or error.code != "dynamic_shape_violation":
            error.tracing_report = state.report()  # type: ignore[attr-defined]
            raise
        traced = _static_fallback(loaded, options, dynamic_shapes, modes, state, error)
    made_static = _made_static(state.fixes, state.source)
    if made_static is not None:
        traced.warnings.append(made_static)
    return traced


def _traced(
    loaded: LoadedModel, options: ExportOptions, spec: Any, modes: list[bool], state: _State
) -> Traced:
    """Every attempt on `spec` (and the fixes torch suggests) until one succeeds; raises
    the classified error of the last."""
    # An example of size 1 in a dim declared dynamic makes torch pin it to 1: trace on a
    # copy widened along it instead (verification still runs on the user's example).
    widened = widen_size_one_dims(loaded.module, loaded.args, loaded.kwargs, spec)
    examples = [(widened.args, widened.kwargs)] if widened is not None else []
    examples.append((loaded.args, loaded.kwargs))
    error: ExportError | None = None
    original_spec = spec
    for args, kwargs in examples:
        spec = original_spec
        for strict in modes:
            for round_ in range(MAX_FIX_ROUNDS + 1):
                spec_json = _json_or_none(spec)
                state.applied = spec_json
                started = time.perf_counter()
                try:
                    ep = torch.export.export(
                        loaded.module, args, kwargs, dynamic_shapes=spec, strict=strict
                    )
                except Exception as exc:
                    error = diagnostics.classify(exc, stage="tracing", source_map=loaded.source_map)
                    if error is not exc:
                        error.__cause__ = exc
                    state.attempts.append(
                        TraceAttempt.model_validate(
                            {
                                "strict": strict,
                                "dynamic_shapes": spec_json,
                                "succeeded": False,
                                "duration_s": time.perf_counter() - started,
                                "error": error.to_body(),
                            }
                        )
                    )
                    fixed = _fixed(exc, spec, options, round_)
                    if fixed is None:
                        break
                    spec, fixes = fixed
                    state.fixes.extend(fixes)
                    continue
                state.attempts.append(
                    TraceAttempt.model_validate(
                        {
                            "strict": strict,
                            "dynamic_shapes": spec_json,
                            "succeeded": True,
                            "duration_s": time.perf_counter() - started,
                        }
                    )
                )
                state.strict_used = strict
                warnings = []
                if widened is not None and args is widened.args:
                    warnings.append(_specialization_avoided(widened))
                return Traced(ep=ep, report=state.report(), warnings=warnings, dynamic_shapes=spec)
    assert error is not None  # at least one attempt ran
    raise error


def _static_fallback(
    loaded: LoadedModel,
    options: ExportOptions,
    requested: Any,
    modes: list[bool],
    state: _State,
    error: ExportError,
) -> Traced:
    """The dims torchport chose for a checkpoint conflict with the model's code: trace
    with only the batch dim dynamic, then with none, and warn `dims_made_static`;
    raises the last error when none traces."""
    for kept in (BATCH_DIMS, frozenset()):
        narrowed, dropped = _narrowed(requested, kept)
        if not dropped:
            continue
        try:
            traced = _traced(loaded, options, _torch_spec(loaded, narrowed, state), modes, state)
        except ExportError as failed:
            error = failed
            continue
        state.requested = plain_json(requested)  # what torchport asked first
        traced.report = state.report()
        traced.warnings.append(
            ReportWarning(
                code="dims_made_static",
                message=(
                    f"The dims torchport chose for this checkpoint ({', '.join(dropped)}) "
                    "conflict with the model's code, so the program takes only the "
                    "example's sizes in them (static). Upload inputs with `dynamic_shapes` "
                    "of your own for other sizes."
                ),
                details={"dims": dropped, "source": "checkpoint", "reason": error.code},
            )
        )
        return traced
    error.tracing_report = state.report()  # type: ignore[attr-defined]
    raise error


BATCH_DIMS = frozenset({"batch_size"})
"""The dims a checkpoint's static fallback keeps first."""


def _narrowed(spec: Any, kept: frozenset[str]) -> tuple[Any, list[str]]:
    """The contract-JSON `spec` with only the dims named in `kept` (None when none is
    left), and the names of the dims dropped, in order."""
    dropped: list[str] = []

    def narrow(value: Any) -> Any:
        if isinstance(value, dict) and not _is_dim(value):
            out = {key: narrow(item) for key, item in value.items()}
            return {key: item for key, item in out.items() if item is not None} or None
        if isinstance(value, list | tuple):
            return [narrow(item) for item in value]
        name = value if isinstance(value, str) else value.get("name") if _is_dim(value) else None
        if name is None or name in kept:
            return value
        if name.isidentifier() and name not in dropped:  # not an expression of dims
            dropped.append(name)
        return None

    narrowed = narrow(spec)
    return narrowed, dropped


def _is_dim(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str)


def _made_static(fixes: list[DynamicShapeFix], source: Source) -> ReportWarning | None:
    """Warning `dims_made_static` when torch's suggested fixes pinned a named dim to one
    size."""
    pinned = [fix.name for fix in fixes if fix.name and isinstance(fix.spec, int)]
    if not pinned:
        return None
    return ReportWarning(
        code="dims_made_static",
        message=(
            f"torch's suggested fixes made {', '.join(pinned)} static (one size): the "
            "program takes no other size in " + ("it." if len(pinned) == 1 else "them.")
        ),
        details={"dims": pinned, "source": source, "reason": "suggested_fix"},
    )


def _specialization_avoided(widened: Widened) -> ReportWarning:
    names = ", ".join(d["name"] for d in widened.dims)
    return ReportWarning(
        code="specialization_avoided",
        message=(
            f"The example has size 1 in dims declared dynamic ({names}); torch would have "
            "specialized them to the constant 1. The program was traced on a copy of the "
            f"example repeated to size {WIDENED_SIZE} along them, so they stay dynamic; "
            "verification used your example."
        ),
        details={"dims": widened.dims},
    )


@dataclass
class _State:
    """What the report will say, gathered while the attempts run."""

    source: Source
    requested: Any = None
    applied: Any = None
    fixes: list[DynamicShapeFix] = field(default_factory=list)
    attempts: list[TraceAttempt] = field(default_factory=list)
    strict_used: bool | None = None

    def report(self) -> TracingReport:
        shapes = {
            "requested": self.requested,
            "applied": self.applied,
            "fixes": self.fixes,
            "source": self.source,
        }
        try:
            dynamic_shapes = DynamicShapesReport.model_validate(shapes)
        except ValidationError:
            # a request outside the grammar fails with InvalidRequest; the report
            # must not fail over it too
            dynamic_shapes = DynamicShapesReport(fixes=self.fixes, source=self.source)
        return TracingReport(
            attempts=self.attempts, strict_used=self.strict_used, dynamic_shapes=dynamic_shapes
        )


def _source(source: str) -> Source:
    if source not in ("options", "module", "checkpoint", "none"):
        raise ValueError(f"unknown dynamic-shapes source {source!r}")
    return source  # type: ignore[return-value]


def _torch_spec(loaded: LoadedModel, spec: Any, state: _State) -> Any:
    """The spec in torch's form; records the requested spec in JSON form."""
    if spec is None or state.source == "none":
        return None
    if state.source in ("options", "checkpoint"):  # both in the contract's JSON form
        state.requested = plain_json(spec)
        return to_torch(spec, loaded.module, loaded.args, loaded.kwargs)
    state.requested = _json_or_none(spec)
    # by the JSON form's rules: what the module's spec leaves out is static, not an error
    return complete(spec, loaded.module, loaded.args, loaded.kwargs)


def _json_or_none(spec: Any) -> Any:
    # a module's spec may hold what the JSON form cannot say (e.g. a ShapesCollection);
    # torch still gets it as is, only the report goes without
    try:
        return to_json(spec)
    except ValueError:
        return None


def _fixed(
    exc: Exception, spec: Any, options: ExportOptions, round_: int
) -> tuple[Any, list[DynamicShapeFix]] | None:
    """The spec with torch's suggested fixes applied, or None when there is nothing to retry."""
    if not options.auto_fix_dynamic_shapes or spec is None or round_ >= MAX_FIX_ROUNDS:
        return None
    message = str(exc)
    fixes = suggested_fixes(message)
    if not fixes:
        return None
    try:
        refined = apply_fixes(message, spec)
    except ValueError:
        return None
    if _json_or_none(refined) == _json_or_none(spec):
        return None  # the fixes change nothing: retrying would fail the same way
    return refined, [fix_to_json(line) for line in fixes]
