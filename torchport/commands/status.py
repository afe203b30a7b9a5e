"""`torchport status ID`: one job of a server — status, stages, artifacts, error and, once
it ended with a report, whether it verified and its generation matched — or, with `--wait`,
followed to its end.

Exit codes (docs/contract.md §8): 0 succeeded, queued or running; 1 failed or canceled (or
`--wait` timed out); 2 refused (`not_found`, …) or the server unreachable.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from schemas import ReportDocument
from torchport.commands.connection import (
    EXIT_FAILED,
    add_server_arguments,
    connect,
    follow,
    job_exit_code,
    print_refusal,
)
from torchport.terminal import json_text, markup

if TYPE_CHECKING:
    from torchport.client import Job


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport status`."""
    parser.add_argument("job_id", metavar="ID", help="the job's id")
    add_server_arguments(parser, json_help="print the job as JSON")
    parser.add_argument("--wait", action="store_true", help="follow the job until it ends")
    parser.add_argument("--timeout", type=float, help="give up waiting after this many seconds")


def run(args: argparse.Namespace) -> int:
    """Print the job; returns the exit code."""
    from torchport.client import TorchportError
    from torchport.job_view import render_job

    err = Console(stderr=True)
    with connect(args) as client:
        try:
            job = client.get(args.job_id)
            if args.wait and not job.done:
                follow(job, err, timeout=args.timeout, quiet=args.json)
        except TorchportError as exc:
            return print_refusal(exc, args.json, err)
        except TimeoutError as exc:
            err.print(f"torchport status: {markup(exc)}")
            return EXIT_FAILED
        if args.json:
            print(json_text(job.data))
        else:
            render_job(job.data, Console())
            _render_report_verdicts(job, err)
    return job_exit_code(job.status)


def _render_report_verdicts(job: Job, err: Console) -> None:
    """Once the job ended with a report.json: whether the program verified, whether its
    generation matched eager transformers, each target's verdict (its report's words, as
    `torchport export` prints them). A report that cannot be fetched or read is said on
    stderr; the job itself was printed."""
    from torchport.client import TorchportError
    from torchport.summary import UnreadableDocument, read_document, render_verdicts

    if not job.done or "report.json" not in {a.name for a in job.data.artifacts}:
        return
    with tempfile.TemporaryDirectory(prefix="torchport-report-") as tmp:
        try:
            job.download(tmp, names=["report.json"])
            report = read_document(ReportDocument, Path(tmp) / "report.json")
        except (TorchportError, UnreadableDocument) as exc:
            err.print(f"torchport status: report.json: {markup(exc)}")
            return
    render_verdicts(report, Console())
