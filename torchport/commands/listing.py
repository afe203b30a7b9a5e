"""`torchport list`: your jobs on a server, newest first, one page at a time.

Exit codes (docs/contract.md §8): 0; 2 refused (a cursor the server did not hand out, a
limit out of range: `invalid_request`) or the server unreachable.
"""

from __future__ import annotations

import argparse
from typing import get_args

from rich.console import Console

from schemas import JobStatus
from torchport.commands.connection import EXIT_OK, add_server_arguments, connect, print_refusal
from torchport.terminal import json_text, markup


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport list`."""
    add_server_arguments(parser, json_help="print the page as JSON: {items, next_cursor}")
    parser.add_argument("--status", choices=get_args(JobStatus), help="only jobs in this status")
    parser.add_argument("--limit", type=int, help="jobs per page, 1 to 100 (default 20)")
    parser.add_argument("--cursor", help="the next page: the cursor the previous page printed")


def run(args: argparse.Namespace) -> int:
    """Print one page of jobs and the cursor of the next; returns the exit code."""
    from torchport.client import TorchportError
    from torchport.job_view import render_jobs

    err = Console(stderr=True)
    with connect(args) as client:
        try:
            page = client.list(status=args.status, limit=args.limit, cursor=args.cursor)
        except TorchportError as exc:
            return print_refusal(exc, args.json, err)
    if args.json:
        print(json_text(page))
        return EXIT_OK
    render_jobs(page.items, Console())
    if page.next_cursor:
        err.print(f"next page: --cursor {markup(page.next_cursor)}", soft_wrap=True)
    return EXIT_OK
