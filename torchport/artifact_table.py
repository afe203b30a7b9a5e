"""The artifacts of a job side by side (`report.profile`): the CLI summary's table.

One row per profiled artifact — `program.pt2` and each target, then the eager model as
the reference — with its size, p50 latency at 1 thread and at the worker's threads, load
time, the memory loading and running it added, whether it was verified, and its accuracy
against float when the job was quantized (`report.quantization.targets`, keyed by target
name). Rows are sorted so the
best deployable choice comes first: verified first, then within the accuracy budget, then
by p50 latency at the worker's threads, then by size (`order_text`); the result page sorts
the same way (service/web/static/profiles.js).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from schemas import ArtifactProfile, ReportDocument, VerificationReport
from torchport.job_view import human_size
from torchport.terminal import markup

__all__ = ["ArtifactRow", "artifact_rows", "order_text", "render_artifact_table"]


def order_text(threads: int, quantized: bool) -> str:
    """How the rows are sorted, said under the table (and on the result page)."""
    budget = "then those within the accuracy budget, " if quantized else ""
    return f"verified first, {budget}then by p50 latency at {threads} threads, then by size"


_RANK = {"verified": 0, "partially_verified": 1}


@dataclass(frozen=True)
class ArtifactRow:
    """One artifact's row: what the table shows, and what it is sorted by."""

    profile: ArtifactProfile
    verdict: str
    """`verified`, `partially_verified`, `failed`, `disabled`, `not verified`, or `reference`
    for the eager model."""
    accuracy: str | None
    """The accuracy against float (`report.quantization`), in words; None when not
    quantized."""
    accurate: bool | None
    """Whether that accuracy is within the budget; None when not quantized."""
    p50_one: float | None
    p50_all: float | None

    def key(self) -> tuple[Any, ...]:
        """Sort key: the best deployable choice first, the eager reference last."""
        return (
            self.profile.kind == "eager",
            _RANK.get(self.verdict, 2),
            self.accurate is False,
            self.p50_all is None,
            self.p50_all or 0.0,
            self.profile.size or 0,
        )


def artifact_rows(report: ReportDocument) -> list[ArtifactRow]:
    """The profiled artifacts of `report`, best deployable choice first; empty when the
    job was not profiled."""
    if report.profile is None:
        return []
    threads = report.profile.machine.threads
    rows = []
    for profile in report.profile.artifacts:
        accuracy, accurate = _accuracy(report, profile.name)
        rows.append(
            ArtifactRow(
                profile=profile,
                verdict=_verdict(report, profile),
                accuracy=accuracy,
                accurate=accurate,
                p50_one=_p50(profile, 1),
                p50_all=_p50(profile, threads),
            )
        )
    return sorted(rows, key=ArtifactRow.key)


def render_artifact_table(report: ReportDocument, console: Console) -> None:
    """Print the artifacts table, the machine it was measured on and the sort order."""
    rows = artifact_rows(report)
    if not rows or report.profile is None:
        return
    machine = report.profile.machine
    threads = machine.threads
    quantized = any(row.accuracy is not None for row in rows)
    table = Table(title="Artifacts", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("artifact", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    for header in ("p50 ms 1 thread", f"p50 ms {threads} threads", "load ms", "memory added MB"):
        table.add_column(header, justify="right", min_width=7)
    words = [_verdict_words(row) for row in rows]
    table.add_column("verified", no_wrap=True, min_width=max(len(w) for w in words))
    if quantized:
        table.add_column("accuracy vs float")
    for row, verdict in zip(rows, words, strict=True):
        profile = row.profile
        cells = [
            profile.artifact or "eager",
            "-" if profile.size is None else human_size(profile.size),
            _ms(row.p50_one),
            _ms(row.p50_all),
            "-" if profile.load_s is None else _ms(profile.load_s * 1000),
            "-" if profile.added_rss_mb is None else f"+{profile.added_rss_mb:.1f}",
            verdict,
        ]
        if quantized:
            cells.append(row.accuracy or "-")
        table.add_row(*map(markup, cells))  # a job's writing, shown as text
    console.print(table)
    isa = ", ".join(machine.isa) or "no vector ISA reported"
    console.print(
        f"  measured on {markup(f'{machine.cpu or machine.architecture} ({isa})')}, "
        f"{threads} threads; up to {report.profile.runs} runs after "
        f"{report.profile.warmup} warm-up; sorted " + order_text(threads, quantized)
    )
    for row in rows:
        if row.profile.error is not None:
            said = f"{row.profile.name}: {row.profile.status}: {row.profile.error}"
            console.print(f"  {markup(said)}")


def _verdict_words(row: ArtifactRow) -> str:
    if row.profile.status != "measured":
        return row.profile.status
    return row.verdict.replace("_", " ")


def _p50(profile: ArtifactProfile, threads: int) -> float | None:
    for latency in profile.latency:
        if latency.threads == threads:
            return latency.p50_ms
    return None


def _verdict(report: ReportDocument, profile: ArtifactProfile) -> str:
    if profile.kind == "eager":
        return "reference"
    verification: VerificationReport | None = report.verification
    if profile.kind == "target":
        target = report.targets.get(profile.name)
        verification = target.verification if target is not None else None
        if verification is None and target is not None and target.generation is not None:
            passed = target.generation.passed
            passed = target.generation.matched if passed is None else passed
            return "verified" if passed else "failed"
    if verification is None or verification.verdict is None:
        return "not verified"
    return verification.verdict


def _accuracy(report: ReportDocument, name: str) -> tuple[str | None, bool | None]:
    """A quantized artifact's accuracy against float in words, and whether it is within the
    budget, from `report.quantization.targets[name]` (None, None when the job was not
    quantized or this artifact was not): the lowest cosine over its outputs (and top-1
    agreement), else tokens matched for generation, else the largest abs error."""
    quantization = getattr(report, "quantization", None)
    if quantization is None:
        return None, None
    entries = _plain(quantization).get("targets")
    entry = entries.get(name) if isinstance(entries, dict) else None
    if not isinstance(entry, dict):
        return None, None
    passed = entry.get("passed") if isinstance(entry.get("passed"), bool) else None
    if entry.get("measured") is False:
        return "not measured", None
    outputs = [o for o in entry.get("outputs") or [] if isinstance(o, dict)]
    cosines = [o["cosine"] for o in outputs if isinstance(o.get("cosine"), int | float)]
    cosine = entry.get("cosine")  # null as absent, as the result page reads it
    if cosine is None:
        cosine = min(cosines) if cosines else None
    generation = entry.get("generation")
    if isinstance(cosine, int | float):
        top1 = entry.get("top1_agreement")
        extra = f", top-1 {top1:.0%}" if isinstance(top1, int | float) else ""
        return f"cosine {cosine:.4f}{extra}", passed
    if isinstance(generation, dict) and "matched" in generation:
        return f"{generation['matched']}/{generation.get('max_new_tokens')} tokens", passed
    max_abs = entry.get("max_abs_error")
    if isinstance(max_abs, int | float):
        return f"max abs {max_abs:.2e}", passed
    return None, passed


def _plain(value: Any) -> dict[str, Any]:
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return value if isinstance(value, dict) else {}


def _ms(value: float | None) -> str:
    """Milliseconds, with three significant digits or more."""
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
