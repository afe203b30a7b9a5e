"""`torchport cancel ID`: cancel a job on a server. A queued job is canceled at once; a
running one keeps the status `running` until its worker killed its sandbox, within a
heartbeat (`torchport status ID --wait` follows it there).

Exit codes (docs/contract.md §8): 0 canceled or cancel asked of its worker; 2 refused
(`conflict`: the job already finished, `details.status`; `not_found`) or the server
unreachable.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from torchport.commands.connection import EXIT_OK, add_server_arguments, connect, print_refusal
from torchport.terminal import json_text, markup


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport cancel`."""
    parser.add_argument("job_id", metavar="ID", help="the job's id")
    add_server_arguments(parser, json_help="print the job as JSON")


def run(args: argparse.Namespace) -> int:
    """Cancel the job and print its status; returns the exit code."""
    from torchport.client import TorchportError
    from torchport.job_view import status_text

    err = Console(stderr=True)
    with connect(args) as client:
        try:
            job = client.cancel(args.job_id)
        except TorchportError as exc:
            return print_refusal(exc, args.json, err)
    if args.json:
        print(json_text(job.data))
    elif job.status == "canceled":
        Console().print(f"{markup(job.id)} {status_text(job.status)}")
    else:
        Console().print(f"{markup(job.id)} {status_text(job.status)}: its worker is stopping it")
    return EXIT_OK
