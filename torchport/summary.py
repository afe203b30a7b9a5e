"""A readable terminal summary of an export's report and signature.

The report and the signature are a job's writing: every text of theirs is shown through
`torchport.terminal.markup` (control characters and rich markup printed as text)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from schemas import (
    GenerationCheck,
    GenerationRun,
    ReportDocument,
    SignatureDocument,
    VerificationReport,
)
from torchport.artifact_table import render_artifact_table
from torchport.job_view import render_error
from torchport.terminal import markup

MAX_DOCUMENT_BYTES = 64 << 20
"""The most of a job's report.json or signature.json read (eight times what a worker
writes by default, `TORCHPORT_SANDBOX_MAX_REPORT_BYTES`)."""
_Document = TypeVar("_Document", bound=BaseModel)


class UnreadableDocument(ValueError):
    """A job's report.json or signature.json is too large, or not what the contract says."""


def read_document(model: type[_Document], path: Path) -> _Document:
    """A job's report.json or signature.json (`model`), read to at most
    `MAX_DOCUMENT_BYTES`.

    Raises:
        UnreadableDocument: it is larger, or no JSON document `model` accepts.
    """
    with path.open("rb") as file:
        data = file.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise UnreadableDocument(f"{path.name} is over {MAX_DOCUMENT_BYTES} bytes")
    try:
        return model.model_validate(json.loads(data))
    except ValueError:  # not JSON, not UTF-8, or not the document
        raise UnreadableDocument(f"{path.name} is not as the contract says") from None


def render_summary(
    report: ReportDocument,
    console: Console,
    out_dir: Path | None,
    signature: SignatureDocument | None = None,
) -> None:
    """Print stages, signature, ranges, verification, the artifacts' profiles and, on
    failure, the error and hint.

    `out_dir`: where the artifacts were written (its `signature.json` is shown unless
    `signature` is given); None when they stay on the server (`torchport submit` without
    `--out`)."""
    ok = report.status == "succeeded"
    colour = "green" if ok else "red"
    status = markup(report.status)
    console.print(f"[bold {colour}]export {status}[/] in {report.duration_s or 0:.2f} s")
    stages = Table("stage", "status", "seconds", title="Stages", title_justify="left")
    for stage in report.stages:
        stages.add_row(markup(stage.name), markup(stage.status), f"{stage.duration_s:.3f}")
    console.print(stages)

    if report.sandbox is not None:
        console.print("Sandbox layers: " + (markup(", ".join(report.sandbox.layers)) or "none"))
    for attempt in report.tracing.attempts:
        mode = "strict" if attempt.strict else "non-strict"
        code = attempt.error.code if attempt.error is not None else "?"
        outcome = "ok" if attempt.succeeded else f"failed ({markup(code)})"
        console.print(f"  trace attempt: {mode}, {outcome}, {attempt.duration_s:.2f} s")
    shapes = report.tracing.dynamic_shapes
    for fix in shapes.fixes:
        console.print(f"  [yellow]dynamic-shape fix applied:[/] {markup(fix.text)}")
    if shapes.fixes:
        console.print(f"  applied spec: {markup(json.dumps(shapes.applied))}")

    if report.decomposition is not None:
        dec = report.decomposition
        console.print(
            f"Ops ({markup(dec.mode)}): {sum(dec.ops_after.values())} calls of "
            f"{len(dec.ops_after)} ops"
            + (
                f"; outside core ATen: {markup(', '.join(dec.non_core_aten_ops))}"
                if dec.non_core_aten_ops
                else ""
            )
        )

    if signature is None and out_dir is not None and (out_dir / "signature.json").is_file():
        try:
            signature = read_document(SignatureDocument, out_dir / "signature.json")
        except UnreadableDocument as exc:
            console.print(f"[yellow]warning[/] {markup(exc)}")
    if ok and signature is not None:
        _render_signature(signature, console)

    if report.verification is not None and report.verification.samples:
        _render_verification(report, console)
    render_verdicts(report, console)
    render_artifact_table(report, console)
    render_weights(report, console)

    for warning in report.warnings:
        message = markup(warning.message, multiline=True)
        console.print(f"[yellow]warning[/] \\[{markup(warning.code)}] {message}")

    if report.error is not None:
        render_error(report.error, console)
        if report.error.code == "weights_mismatch":
            _render_mismatched_names(report.error.details, console)
        for issue in report.draft_export or []:
            where = f" at {issue.location.file}:{issue.location.line}" if issue.location else ""
            first_line = issue.message.splitlines()[0] if issue.message else ""
            console.print(f"  draft-export issue: {markup(f'{issue.type}{where}: {first_line}')}")
    else:
        where = f" in {markup(out_dir)}" if out_dir is not None else ""
        console.print(f"artifacts{where}: " + markup(", ".join(a.name for a in report.artifacts)))


def render_verdicts(report: ReportDocument, console: Console) -> None:
    """Whether the program verified against eager PyTorch, whether its generation matched
    eager transformers (and its encoder's verdict), and each target's: a line each, as
    `torchport export` and `torchport status` print them."""
    if report.verification is not None:
        console.print(f"Verification: {verdict_text(report.verification)}")
    if report.generation is not None:
        made = report.generation
        console.print(
            f"Generation: static KV cache of {made.max_cache_len} tokens; "
            + (generation_text(made.check) if made.check else "not checked")
        )
        if made.check is not None and made.check.prompt_ids:
            console.print(f"  prompts: {prompts_text(made.check)}")
        if made.encoder is not None:
            encoder = made.encoder
            shape = ", ".join(str(size) for size in encoder.input_shape)
            parts = [markup(f"{encoder.artifact} ({', '.join(encoder.inputs)} [{shape}])")]
            if encoder.verification is not None:
                parts.append(verdict_text(encoder.verification))
            if encoder.roundtrip is not None:
                parts.append(f"round trip {markup(encoder.roundtrip.status)}")
            console.print("Encoder: " + ", ".join(parts))
    for name, target in report.targets.items():
        checked = f", {verdict_text(target.verification)}" if target.verification else ""
        if target.generation is not None:
            checked += f", {generation_text(target.generation)}"
        console.print(f"Target {markup(name)}: {markup(target.status)}{checked}")


def render_weights(report: ReportDocument, console: Console) -> None:
    """How the weights file was loaded, and the names a non-strict load left out
    (`report.weights`): the first `MAX_NAMES` of each list, then how many more."""
    weights = report.weights
    if weights is None:
        return
    key = f" (key {markup(weights.key)})" if weights.key is not None else ""
    mode = "" if weights.strict else ", not strict"
    console.print(
        f"Weights: {markup(weights.file)}{key}: {weights.loaded} of {weights.tensors} "
        f"tensors loaded{mode}"
    )
    _print_names(console, "missing from the file", weights.missing, weights.missing_count)
    _print_names(console, "not in the model", weights.unexpected, weights.unexpected_count)


def _render_mismatched_names(details: dict[str, Any], console: Console) -> None:
    """The names of a `weights_mismatch` (its details, a job's writing: checked here)."""
    lists = (("missing from the file", "missing"), ("not in the model", "unexpected"))
    for label, field in lists:
        names = details.get(field)
        if isinstance(names, list):
            _print_names(console, label, [str(name) for name in names], len(names))
    shapes = details.get("shape_mismatch")
    if isinstance(shapes, list):
        keys = [str(item.get("key")) for item in shapes if isinstance(item, dict)]
        _print_names(console, "of another shape", keys, len(keys))


MAX_NAMES = 20
"""State-dict names printed per list; the count says how many there are."""


def _print_names(console: Console, label: str, names: list[str], count: int) -> None:
    if not count:
        return
    more = count - min(len(names), MAX_NAMES)
    shown = ", ".join(names[:MAX_NAMES]) + (f", … and {more} more" if more > 0 else "")
    console.print(f"  weights {label} ({count}): {markup(shown)}")


MAX_PROMPT_IDS = 8
"""Token ids printed per prompt; an ellipsis and the prompt's length stand for the rest."""


def generation_text(check: GenerationCheck) -> str:
    """A generation check in words: how many tokens from how many runs, and where a run
    first differs (the later runs start again at position 0 on the same artifact)."""
    runs = len(check.runs) + 1
    if check.matched:
        counted = (
            f" from each of {runs} runs, {runs - 1} restarted at position 0" if runs > 1 else ""
        )
        return f"generation matches eager transformers ({check.max_new_tokens} tokens{counted})"
    every: list[GenerationCheck | GenerationRun] = [check, *check.runs]
    noisy = [run for run in every if run.within_noise]
    if check.passed and noisy:
        first = noisy[0]
        return (
            f"generation matches eager transformers up to a near tie: first differs at token "
            f"{first.first_mismatch}, where eager's margin {first.margin or 0:.3g} is within "
            f"its own {check_dtype_noise(first.noise)} ({len(check.runs) + 1} runs)"
        )
    if check.first_mismatch is not None or not check.runs:
        return f"generation differs from eager transformers at token {check.first_mismatch}"
    failed = [(i, r) for i, r in enumerate(check.runs, start=2) if not r.matched]
    if not failed:  # a report that says neither where: nothing more to print
        return "generation differs from eager transformers"
    number, run = failed[0]
    return (
        f"generation differs from eager transformers at token {run.first_mismatch} of run "
        f"{number} ({markup(run.prompt)} prompt, restarted at position 0)"
    )


def check_dtype_noise(noise: float | None) -> str:
    """The noise a near tie was judged within, in words."""
    return "rounding noise" if noise is None else f"rounding noise {noise:.3g} (twice allowed)"


def prompts_text(check: GenerationCheck) -> str:
    """The prompts the check ran, in order: their first token ids and lengths (an
    encoder-decoder model's: its encoder input's, where they are token ids)."""
    shown = [(check.prompt_ids, check.encoder_input_ids)] + [
        (run.prompt_ids, run.encoder_input_ids) for run in check.runs
    ]
    parts = []
    for prompt_ids, encoder_ids in shown:
        ids = prompt_ids if encoder_ids is None else encoder_ids
        head = " ".join(str(token) for token in ids[:MAX_PROMPT_IDS])
        more = " …" if len(ids) > MAX_PROMPT_IDS else ""
        label = "" if encoder_ids is None else "encoder input "
        parts.append(f"{label}[{head}{more}] ({len(ids)} token{'' if len(ids) == 1 else 's'})")
    return markup(", then ".join(parts))


def verdict_text(verification: VerificationReport) -> str:
    """The verdict in words: "verified" only when every sample was checked and passed."""
    total = len(verification.samples)
    if verification.verdict == "partially_verified":
        return (
            f"partially verified ({verification.checked} of {total} samples; "
            f"{verification.skipped} skipped)"
        )
    if verification.verdict == "verified":
        return f"verified ({total} sample{'' if total == 1 else 's'})"
    if verification.verdict == "failed":
        return "verification failed"
    return "not verified"


def _render_signature(signature: SignatureDocument, console: Console) -> None:
    table = Table("input", "kind", "shape", "dtype", title="Signature", title_justify="left")
    for spec in signature.inputs:
        if spec.kind == "user_input":
            cells = (spec.pytree_path or spec.name, spec.kind, str(spec.shape), spec.dtype or "")
            table.add_row(*map(markup, cells))
    for out in signature.outputs:
        cells = (out.pytree_path or out.name, out.kind, str(out.shape), out.dtype or "")
        table.add_row(*map(markup, cells))
    console.print(table)
    if signature.range_constraints:
        ranges = ", ".join(
            f"{rc.symbol} ∈ [{rc.min}, {'∞' if rc.max is None else rc.max}]"
            for rc in signature.range_constraints
        )
        console.print(f"Ranges: {markup(ranges)}")


def _render_verification(report: ReportDocument, console: Console) -> None:
    assert report.verification is not None
    table = Table(
        "sample",
        "output",
        "max abs",
        "max rel",
        "result",
        title="Verification",
        title_justify="left",
    )
    for sample in report.verification.samples:
        if sample.status == "skipped":
            table.add_row(
                markup(sample.label), "-", "-", "-", markup(f"skipped: {sample.reason or ''}")
            )
            continue
        for out in [*sample.outputs, *sample.buffers]:
            table.add_row(
                markup(sample.label),
                markup(out.path or "output"),
                "-" if out.max_abs_error is None else f"{out.max_abs_error:.2e}",
                "-" if out.max_rel_error is None else f"{out.max_rel_error:.2e}",
                "[green]✓[/]" if out.passed else "[red]✗[/]",
            )
    console.print(table)
    rt = report.verification.roundtrip
    if rt is not None:
        loader, status = markup(rt.loader), markup(rt.status)
        console.print(f"Round trip ({loader}): {status}, bitwise equal: {rt.bitwise_equal}")
