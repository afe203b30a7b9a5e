"""What the commands that talk to a server share: `--server`, `--api-key` and `--json`, the
error answer printed, a job followed to its end, and the exit codes (docs/contract.md §8).

Exit codes: 0 done (a job succeeded, or is still on its way); 1 the job failed or was
canceled, or waiting for it timed out; 2 a usage error, a request the server refused
(its error body, with `--json` on stdout) or a server that cannot be reached
(`unavailable`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.console import Console

from torchport.terminal import json_text, markup

if TYPE_CHECKING:
    from torchport.client import Client, Job, TorchportError

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


def add_server_arguments(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    """`--server`, `--api-key` and `--json`, as `torchport submit` has them."""
    parser.add_argument("--server", help="server URL (TORCHPORT_SERVER, default 127.0.0.1:8000)")
    parser.add_argument("--api-key", help="API key (TORCHPORT_API_KEY)")
    parser.add_argument("--json", action="store_true", help=json_help)


def connect(args: argparse.Namespace) -> Client:
    """A client for the server and key the arguments (or the environment) name."""
    from torchport.client import Client

    return Client(args.server, args.api_key)


def print_refusal(exc: TorchportError, as_json: bool, console: Console) -> int:
    """Print an error answer of the API (the error body with `--json`); returns exit 2."""
    if as_json:
        body = exc.body.model_dump(mode="json") if exc.body else None
        print(json_text(body or {"code": exc.code, "message": exc.message}, indent=None))
        return EXIT_REFUSED
    message = markup(exc.message, multiline=True)
    console.print(f"[bold red]error[/] \\[{markup(exc.code)}] {message}")
    errors = exc.body.details.get("errors") if exc.body is not None else None
    # an invalid option: what the server says of each (an option's allowed values)
    for item in errors[:MAX_ERRORS_SHOWN] if isinstance(errors, list) else []:
        if isinstance(item, dict) and item.get("message"):
            field = markup(item.get("field") or "")
            console.print(f"  {field}: {markup(item['message'], multiline=True)}")
    if exc.body is not None and exc.body.hint:
        console.print(f"[bold]hint:[/] {markup(exc.body.hint, multiline=True)}")
    return EXIT_REFUSED


MAX_ERRORS_SHOWN = 10
"""The validation errors of a refusal printed in the terminal (`--json` has them all)."""


def job_exit_code(status: str) -> int:
    """0 for a job that succeeded or is still queued or running, 1 for one that failed or
    was canceled."""
    return EXIT_FAILED if status in ("failed", "canceled") else EXIT_OK


def follow(job: Job, console: Console, *, timeout: float | None, quiet: bool) -> Job:
    """Wait for the job, with a progress bar of its stages on a terminal.

    Raises:
        TimeoutError: it did not finish within `timeout` seconds.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from schemas import STAGES
    from torchport.progress_lines import ProgressLines

    # no terminal (a log, a pipe): the bar draws nothing, so each stage is a line
    lines = None if quiet or console.is_terminal else ProgressLines(console)

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
    ) as bar:
        name = markup(job.id[:8])
        task = bar.add_task(f"{name} {job.status}", total=len(STAGES))

        def on_event(event: Any) -> None:
            done = STAGES.index(event.stage) if event.stage in STAGES else 0
            bar.update(task, completed=done, description=f"{name} {event.stage or event.status}")
            if lines is not None:
                lines(event.stage or event.status, event.message)

        job.wait(timeout=timeout, on_event=on_event)
        bar.update(task, completed=len(STAGES), description=f"{name} {job.status}")
    return job
