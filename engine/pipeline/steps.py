"""The steps `engine.pipeline.export` takes around the stages: portability, recovery, reports.

What `_export` calls beside the stages themselves: making inputs and outputs portable
(`apply_portability`), the deferred eager reference run (`run_reference`), the dynamic-
shapes suggestion and the draft-export issues for the report, keeping ops undecomposed
until verification passes (`keep_ops_until_verified`) and the `verification_failed`
error, the `partially_verified` warning (`partial_verification_warning`), the save →
load round trip (`check_roundtrip`) and writing the JSON documents. The stages after
serializing (targets, profiles) are `engine.pipeline.target_stages`'.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from engine.decompose import decomposition
from engine.errors import (
    EagerRunFailed,
    ExportError,
    SerializationFailed,
    VerificationFailed,
)
from engine.load import module_copies
from engine.load.checkpoint.building import generated_inputs_failed
from engine.load.eager import run_eager
from engine.load.model import LoadedModel
from engine.pipeline.run_state import ExportRun
from engine.serialize import documents, portability, roundtrip
from engine.shapes.examples import suggest_spec
from engine.shapes.grammar import to_torch
from engine.shapes.structure import complete
from engine.trace import draft
from engine.verify import verification
from schemas import ReportWarning, VerificationReport, dynamic_shapes_adapter
from schemas.text import without_surrogates

if TYPE_CHECKING:
    from engine.pipeline.request import RoundtripRunner

Document = TypeVar("Document", bound=BaseModel)

__all__ = [
    "DRAFT_WORTHY",
    "apply_portability",
    "check_roundtrip",
    "draft_section",
    "keep_ops_until_verified",
    "partial_verification_warning",
    "plain_options",
    "run_reference",
    "suggest_dynamic_shapes",
    "unknown_output",
    "verification_failed",
    "write_json",
]


def partial_verification_warning(
    report: VerificationReport, target: str | None = None
) -> ReportWarning | None:
    """`partially_verified` when no check failed but some samples were skipped (the eager
    model or the program's guards rejected their inputs, or a sample was over a bound:
    `verify.max_sample_cost`, the job's `memory_mb`): the result is not *verified*.
    None otherwise. `target` names a deployment target's verification."""
    if report.verdict != "partially_verified":
        return None
    skipped = [s for s in report.samples if s.status == "skipped"]
    total = len(report.samples)
    where = f"target {target}" if target is not None else "the exported program"
    details: dict[str, Any] = {
        "samples": [
            {"label": s.label, "reason": s.reason, "symbols": s.symbols, "bound": s.bound}
            for s in skipped
        ],
        "checked": report.checked,
        "skipped": len(skipped),
        "total": total,
    }
    if target is not None:
        details["target"] = target
    return ReportWarning(
        code="partially_verified",
        message=f"{where}: partially verified ({report.checked} of {total} samples; "
        f"{len(skipped)} skipped: " + ", ".join(s.label for s in skipped) + ")",
        details=details,
    )


def apply_portability(run: ExportRun, loaded: LoadedModel) -> portability.Portable:
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


def keep_ops_until_verified(
    run: ExportRun,
    traced: torch.export.ExportedProgram,
    decomposed: decomposition.Decomposed,
    checked: Any,
    loaded: LoadedModel,
    pristine: torch.nn.Module,
    names: Mapping[str, str] | None = None,
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
        reports[id(trial)] = verification.verify(
            trial, pristine, args, kwargs, opts.verify, names=names
        )
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


def verification_failed(checked: Any, undecomposed_passed: bool | None) -> VerificationFailed:
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
    if "precision" in details:
        judged = details["precision"]
        message = (
            f"The exported program's {details.get('dtype')} outputs are "
            f"further from a float32 reference of the same weights "
            f"({judged['exported_error']:.3g}) than {judged['ratio']:g} times eager "
            f"PyTorch's own error in that dtype ({judged['eager_error']:.3g})."
        )
        hint = (
            "This compares the program and eager PyTorch in the model's reduced precision "
            "against the same weights run in float32: the program loses more precision "
            "than eager does. Export in float32 to check the program itself, or set "
            "verify.atol/rtol to accept this error."
        )
    if undecomposed_passed:
        details["undecomposed_passed"] = True
        hint = (
            "The program before decomposition passed and no set of ops kept undecomposed "
            'fixed it: use decomposition.mode "none", or preserve the ops involved.'
        )
    return VerificationFailed(message, hint=hint, details=details)


def suggest_dynamic_shapes(run: ExportRun, source: str) -> None:
    """Propose a spec in the report when the export had none (from the inputs alone)."""
    if source == "none":
        suggested = suggest_spec(run.sections.get("inputs", []))
        if suggested is not None:
            run.sections[
                "tracing"
            ].dynamic_shapes.suggested = dynamic_shapes_adapter.validate_python(suggested)


def unknown_output(exc: ExportError) -> bool:
    """Whether tracing failed on an output of a type pytree does not know."""
    text = f"{exc} {exc.__cause__}"
    return "in output, which is not a known type" in text


def run_reference(loaded: LoadedModel) -> None:
    """The eager reference run, when load did not do it; raises `eager_run_failed`."""
    if loaded.eager_outputs is None:
        try:
            loaded.eager_outputs, loaded.eager_buffers = run_eager(
                loaded.module, loaded.args, loaded.kwargs, loaded.source_map
            )
        except EagerRunFailed as exc:
            checkpoint = loaded.checkpoint
            if checkpoint is not None and checkpoint.generated_inputs:
                generated_inputs_failed(exc, checkpoint.task)
            raise


DRAFT_WORTHY = frozenset(
    {"data_dependent", "dynamic_shape_violation", "missing_fake_kernel", "unsupported_python"}
)
"""Tracing failures after which draft export finds more (and every) issue."""


def draft_section(loaded: LoadedModel, spec: Any, source: str) -> list[Any]:
    """draft_export's issue list; non-strict, since strict drafts stop at graph breaks."""
    try:
        if source == "options":
            spec = to_torch(spec, loaded.module, loaded.args, loaded.kwargs)
        elif source == "module":
            spec = complete(spec, loaded.module, loaded.args, loaded.kwargs)
    except ExportError:
        spec = None
    return draft.draft_issues(loaded, spec, strict=False)


def check_roundtrip(
    run: ExportRun,
    ep: torch.export.ExportedProgram,
    loaded: LoadedModel,
    program: Path,
    runner: RoundtripRunner,
    expected: list[Any] | None = None,
) -> None:
    """The saved program loaded and run in a fresh process, compared bit for bit with
    the program's outputs here: `expected[0]`, those verification computed on the example,
    or, when not given, a run of `ep` now."""
    payload = run.request.work_dir / "roundtrip-payload.pt"
    if expected:
        outputs = expected[0]
    else:
        with torch.no_grad():
            module = module_copies.sharing_weights(ep.module())  # ep's buffers stay as saved
            outputs = module(*copy.deepcopy(loaded.args), **copy.deepcopy(loaded.kwargs))
    roundtrip.write_payload(payload, loaded.args, loaded.kwargs, outputs)
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


def _first_failure(checked: Any) -> dict[str, Any]:
    for sample in checked.samples:
        if sample.status == "failed" and not any(
            not out.passed for out in [*sample.outputs, *sample.buffers]
        ):
            return {"sample": sample.label, "reason": sample.reason}
        for out in [*sample.outputs, *sample.buffers]:
            if not out.passed:
                found: dict[str, Any] = {
                    "sample": sample.label,
                    "output": out.path,
                    "dtype": out.dtype,
                    "max_abs_error": out.max_abs_error,
                    "max_rel_error": out.max_rel_error,
                    "atol": out.atol,
                    "rtol": out.rtol,
                }
                if out.precision is not None:
                    found["precision"] = out.precision.model_dump()
                return found
    return {}


def plain_options(spec: Any) -> Any:
    """The JSON form of an options value that may hold pydantic models."""
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json", exclude_none=True)
    if isinstance(spec, dict):
        return {key: plain_options(value) for key, value in spec.items()}
    if isinstance(spec, list):
        return [plain_options(value) for value in spec]
    return spec


def write_json(path: Path, document: Document, artifacts: dict[str, Path]) -> Document:
    """Write one of the job's documents (report, graph, signature) as UTF-8 JSON and return
    it as written: itself, or, when some of its text holds a lone surrogate, a copy with
    each replaced by U+FFFD. The user's own text (an exception message, a module path)
    may hold one, which UTF-8 cannot encode, and the document must still be written
    (without it a job ends with no report instead of the user's error)."""
    try:
        text = document.model_dump_json(indent=2)
    except PydanticSerializationError:  # a lone surrogate (anything else raises again)
        plain = without_surrogates(document.model_dump(mode="json"))
        document = type(document).model_validate(plain)
        text = document.model_dump_json(indent=2)
    path.write_text(text, encoding="utf-8")
    artifacts[path.name] = path
    return document
