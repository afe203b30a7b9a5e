"""`torchport status ID`: one job of a server — status, stages, artifacts, error — or, with
`--wait`, followed to its end.

Exit codes (docs/contract.md §8): 0 succeeded, queued or running; 1 failed or canceled (or
`--wait` timed out); 2 refused (`not_found`, …) or the server unreachable.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from torchport.commands.connection import (
    EXIT_FAILED,
    add_server_arguments,
    connect,
    follow,
    job_exit_code,
    print_refusal,
)
from torchport.terminal import json_text, markup


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
    return job_exit_code(job.status)
