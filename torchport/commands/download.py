"""`torchport download ID`: the artifacts of a finished job into a directory: all of them
as one zip (`GET …/artifacts.zip`, unpacked and each file checked against its size and
SHA-256), or with `--only NAME` those one by one.

Exit codes (docs/contract.md §8): 0 the job succeeded and its files are saved; 1 the job
failed or was canceled (what it has, its report.json, is saved); 2 refused (`conflict`:
not finished yet, `expired`, `not_found`) or the server unreachable.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from torchport.commands.connection import add_server_arguments, connect, job_exit_code
from torchport.terminal import json_text, markup


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport download`."""
    parser.add_argument("job_id", metavar="ID", help="the job's id")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory (default: .)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="download only this artifact, e.g. program.pt2 (repeatable)",
    )
    add_server_arguments(parser, json_help="print the job id, status and saved files as JSON")


def run(args: argparse.Namespace) -> int:
    """Download and print what was saved; returns the exit code."""
    from torchport.client import TorchportError
    from torchport.commands.connection import print_refusal
    from torchport.job_view import human_size

    err = Console(stderr=True)
    with connect(args) as client:
        try:
            job = client.get(args.job_id)
            paths = job.download(args.out, names=args.only)
        except TorchportError as exc:
            return print_refusal(exc, args.json, err)
    digests = {a.name: a.sha256 for a in job.data.artifacts}
    saved = [(path, path.stat().st_size, digests.get(path.name, "")) for path in paths]
    if args.json:
        files = [
            {"name": p.name, "path": str(p), "size": size, "sha256": sha} for p, size, sha in saved
        ]
        print(json_text({"id": job.id, "status": job.status, "files": files}))
    else:
        title = f"{markup(job.id)} {job.status}, saved in {markup(args.out)}"
        table = Table("file", "size", "sha256", title=title, title_justify="left")
        for path, size, sha in saved:
            table.add_row(markup(path.name), human_size(size), markup(sha[:16]))
        Console().print(table)
    return job_exit_code(job.status)
