"""A readable terminal summary of an export's report and signature."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from schemas import GenerationCheck, ReportDocument, SignatureDocument, VerificationReport
from torchport.artifact_table import render_artifact_table
from torchport.job_view import render_error


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
    console.print(f"[bold {colour}]export {report.status}[/] in {report.duration_s or 0:.2f} s")
    stages = Table("stage", "status", "seconds", title="Stages", title_justify="left")
    for stage in report.stages:
        stages.add_row(stage.name, stage.status, f"{stage.duration_s:.3f}")
    console.print(stages)

    if report.sandbox is not None:
        console.print("Sandbox layers: " + (", ".join(report.sandbox.layers) or "none"))
    for attempt in report.tracing.attempts:
        mode = "strict" if attempt.strict else "non-strict"
        outcome = "ok" if attempt.succeeded else f"failed ({attempt.error.code})"  # type: ignore[union-attr]
        console.print(f"  trace attempt: {mode}, {outcome}, {attempt.duration_s:.2f} s")
    shapes = report.tracing.dynamic_shapes
    for fix in shapes.fixes:
        console.print(f"  [yellow]dynamic-shape fix applied:[/] {fix.text}")
    if shapes.fixes:
        console.print(f"  applied spec: {json.dumps(shapes.applied)}")

    if report.decomposition is not None:
        dec = report.decomposition
        console.print(
            f"Ops ({dec.mode}): {sum(dec.ops_after.values())} calls of {len(dec.ops_after)} ops"
            + (
                f"; outside core ATen: {', '.join(dec.non_core_aten_ops)}"
                if dec.non_core_aten_ops
                else ""
            )
        )

    if signature is None and out_dir is not None and (out_dir / "signature.json").is_file():
        signature = SignatureDocument.model_validate_json((out_dir / "signature.json").read_text())
    if ok and signature is not None:
        _render_signature(signature, console)

    if report.verification is not None and report.verification.samples:
        _render_verification(report, console)
    if report.verification is not None:
        console.print(f"Verification: {verdict_text(report.verification)}")
    if report.generation is not None:
        made = report.generation
        console.print(
            f"Generation: static KV cache of {made.max_cache_len} tokens; "
            + (generation_text(made.check) if made.check else "not checked")
        )
        if made.encoder is not None:
            encoder = made.encoder
            shape = ", ".join(str(size) for size in encoder.input_shape)
            parts = [f"{encoder.artifact} ({', '.join(encoder.inputs)} [{shape}])"]
            if encoder.verification is not None:
                parts.append(verdict_text(encoder.verification))
            if encoder.roundtrip is not None:
                parts.append(f"round trip {encoder.roundtrip.status}")
            console.print("Encoder: " + ", ".join(parts))
    for name, target in report.targets.items():
        checked = f", {verdict_text(target.verification)}" if target.verification else ""
        if target.generation is not None:
            checked += f", {generation_text(target.generation)}"
        console.print(f"Target {name}: {target.status}{checked}")
    render_artifact_table(report, console)

    for warning in report.warnings:
        console.print(f"[yellow]warning[/] \\[{warning.code}] {escape(warning.message)}")

    if report.error is not None:
        render_error(report.error, console)
        for issue in report.draft_export or []:
            where = f" at {issue.location.file}:{issue.location.line}" if issue.location else ""
            first_line = issue.message.splitlines()[0] if issue.message else ""
            console.print(f"  draft-export issue: {issue.type}{where}: {escape(first_line)}")
    else:
        where = f" in {escape(str(out_dir))}" if out_dir is not None else ""
        console.print(f"artifacts{where}: " + ", ".join(a.name for a in report.artifacts))


def generation_text(check: GenerationCheck) -> str:
    """A generation check in words."""
    if check.matched:
        return f"generation matches eager transformers ({check.max_new_tokens} tokens)"
    return f"generation differs from eager transformers at token {check.first_mismatch}"


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
            table.add_row(
                spec.pytree_path or spec.name, spec.kind, str(spec.shape), spec.dtype or ""
            )
    for out in signature.outputs:
        table.add_row(out.pytree_path or out.name, out.kind, str(out.shape), out.dtype or "")
    console.print(table)
    if signature.range_constraints:
        ranges = ", ".join(
            f"{rc.symbol} ∈ [{rc.min}, {'∞' if rc.max is None else rc.max}]"
            for rc in signature.range_constraints
        )
        console.print(f"Ranges: {ranges}")


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
            table.add_row(sample.label, "-", "-", "-", f"skipped: {sample.reason or ''}")
            continue
        for out in [*sample.outputs, *sample.buffers]:
            table.add_row(
                sample.label,
                out.path or "output",
                "-" if out.max_abs_error is None else f"{out.max_abs_error:.2e}",
                "-" if out.max_rel_error is None else f"{out.max_rel_error:.2e}",
                "[green]✓[/]" if out.passed else "[red]✗[/]",
            )
    console.print(table)
    rt = report.verification.roundtrip
    if rt is not None:
        console.print(f"Round trip ({rt.loader}): {rt.status}, bitwise equal: {rt.bitwise_equal}")
