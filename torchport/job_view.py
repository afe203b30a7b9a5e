"""Jobs of a server in the terminal: one job (`torchport status`), a page of them
(`torchport list`), and an error as `torchport export` prints it. Every text of a job is
shown through `torchport.terminal.markup`: its control characters and rich markup are
printed as text, never run."""

from __future__ import annotations

from datetime import datetime

from rich.console import Console
from rich.table import Table

from schemas import ErrorBody, JobPublic, JobSummary
from torchport.terminal import markup

_COLOURS = {"succeeded": "green", "failed": "red", "canceled": "yellow"}


def status_text(status: str) -> str:
    """A job status, coloured as the summary colours it."""
    colour = _COLOURS.get(status)
    return f"[{colour}]{status}[/]" if colour else markup(status)


def _when(moment: datetime | None) -> str:
    return "" if moment is None else moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _seconds(start: datetime | None, end: datetime | None) -> str:
    return "" if start is None or end is None else f"{(end - start).total_seconds():.2f}"


def human_size(size: int) -> str:
    """Bytes in the largest unit that keeps a number of at least 1."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def render_error(error: ErrorBody, console: Console) -> None:
    """The error as `torchport export` prints it: code, stage and message, the line of the
    upload that caused it (`at file:line`), and the hint."""
    stage = f" ({markup(error.stage)})" if error.stage else ""
    message = markup(error.message, multiline=True)
    console.print(f"[bold red]error[/] \\[{markup(error.code)}]{stage} {message}")
    if error.location is not None:
        code = markup(error.location.code or "")
        console.print(f"  at {markup(error.location.file)}:{error.location.line}: {code}")
    if error.hint:
        console.print(f"[bold]hint:[/] {markup(error.hint, multiline=True)}")
    if error.exportdb:
        console.print("  related ExportDB cases: " + markup(", ".join(error.exportdb)))


def render_job(job: JobPublic, console: Console) -> None:
    """The job: what was uploaded, its status and times, its stage changes, its artifacts
    and, when it failed, its error."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    uploads = ", ".join(
        n
        for n in (
            job.model_name,
            job.inputs_name,
            job.weights_name,
            job.calibration_name,
        )
        if n
    )
    rows: list[tuple[str, str]] = [
        ("job", markup(job.id)),
        ("status", status_text(job.status) + (f" ({markup(job.stage)})" if job.stage else "")),
        ("uploads", markup(uploads)),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
        ("seconds", _seconds(job.created_at, job.finished_at)),
        ("attempts", str(job.attempts)),
    ]
    if job.cache_hit:
        rows.append(("cache hit", "yes"))
    if job.options.targets:
        rows.append(("targets", markup(", ".join(job.options.targets))))
    if job.webhook is not None:
        rows.append(("webhook", markup(job.webhook.status)))
    if job.expired_at is not None:
        rows.append(("expired", _when(job.expired_at)))
    for name, value in rows:
        if value:
            facts.add_row(name, value)
    console.print(facts)

    changes = [e for e in job.stages if e.status != "progress"]
    if changes:
        stages = Table("at", "stage", "status", title="Stages", title_justify="left")
        for event in changes:
            stages.add_row(_when(event.at), markup(event.stage or ""), markup(event.status))
        console.print(stages)
    if job.artifacts:
        table = Table("artifact", "size", "sha256", title="Artifacts", title_justify="left")
        for artifact in job.artifacts:
            size = human_size(artifact.size)
            table.add_row(markup(artifact.name), size, markup(artifact.sha256[:16]))
        console.print(table)
    if job.error is not None and job.status != "canceled":
        render_error(job.error, console)


_JOB_COLUMNS = ("job", "status", "error", "seconds", "created", "model", "targets")


def _job_cells(item: JobSummary) -> tuple[str, ...]:
    status = status_text(item.status) + (f" ({markup(item.stage)})" if item.stage else "")
    if item.cache_hit:
        status += " (cache hit)"
    return (
        markup(item.id),
        status,
        markup(item.error.code) if item.error else "",
        _seconds(item.created_at, item.finished_at),
        _when(item.created_at),
        markup(item.model_name or ""),
        markup(", ".join(item.targets)),
    )


def render_jobs(items: list[JobSummary], console: Console) -> None:
    """A page of job summaries, newest first: a table where every cell fits whole on the
    console's width; on a narrower one (80 columns), each job as its id then a line per
    field (`status  failed (tracing)`) instead, so that no value is ever cut to "…"."""
    table = Table(title_justify="left")
    for name in _JOB_COLUMNS:
        table.add_column(name, no_wrap=True)
    rows = [_job_cells(item) for item in items]
    for row in rows:
        table.add_row(*row)
    natural = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    if natural <= console.width:
        console.print(table)
        return
    for row in rows:
        job, *rest = row
        console.print(f"[bold]{job}[/]", soft_wrap=True)
        for name, value in zip(_JOB_COLUMNS[1:], rest, strict=True):
            if value:
                console.print(f"  {name:<8} {value}", soft_wrap=True)
