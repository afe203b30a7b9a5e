"""`torchport submit`: send a model to a torchport server, follow it, fetch the artifacts,
and print what `torchport export` prints (the summary of its report.json).

Exit codes as `torchport export`: 0 succeeded (or submitted without --wait), 1 the export
failed or was canceled, 2 the request was refused or the server unreachable.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from schemas import ReportDocument, SignatureDocument
from torchport.checkpoints import UnusableAdapter, upload_path
from torchport.commands.connection import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    add_server_arguments,
    connect,
    follow,
    job_exit_code,
    print_refusal,
)
from torchport.commands.upload_options import add_upload_arguments, requires_of
from torchport.job_view import render_error
from torchport.summary import render_summary

if TYPE_CHECKING:
    from torchport.client import Job


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport submit`."""
    add_upload_arguments(parser)
    add_server_arguments(parser, json_help="print the job as JSON")
    parser.add_argument(
        "--callback-url", help="POSTed the job, signed, when it ends (http:// or https://)"
    )
    parser.add_argument("--wait", action="store_true", help="wait for the job to finish")
    parser.add_argument("--out", type=Path, help="download the artifacts here (implies --wait)")
    parser.add_argument("--timeout", type=float, help="give up waiting after this many seconds")


def _load_json(value: str) -> Any:
    text = value if value.lstrip()[:1] in ("{", "[", '"') else Path(value).read_text()
    return json.loads(text)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = _load_json(args.options) if args.options else {}
    if args.dynamic_shapes:
        options["dynamic_shapes"] = _load_json(args.dynamic_shapes)
    if args.strict:
        options["strict"] = True
    requires_of(args, options)
    return options


def run(args: argparse.Namespace) -> int:
    """Submit, optionally wait with a progress bar and download; returns the exit code."""
    from torchport.client import TorchportError

    console = Console(stderr=True)
    try:
        options = _options(args)
    except (OSError, ValueError) as exc:
        console.print(f"torchport submit: bad --options/--dynamic-shapes: {exc}")
        return EXIT_REFUSED
    wait = args.wait or args.out is not None
    with (
        connect(args) as client,
        tempfile.TemporaryDirectory(prefix="torchport-checkpoints-") as zips,
    ):
        try:
            try:
                model = upload_path(
                    args.model,
                    Path(zips),
                    lambda text: console.print(escape(text)),
                    adapter=args.adapter,
                )
            except UnusableAdapter as exc:
                console.print(f"torchport submit: {escape(str(exc))}")
                return EXIT_REFUSED
            job = client.submit(
                model,
                inputs=args.inputs,
                weights=args.weights,
                calibration=args.calibration,
                options=options or None,
                callback_url=args.callback_url,
            )
            if wait and not job.done:
                follow(job, console, timeout=args.timeout, quiet=args.json)
            if args.out is not None and job.done:
                job.download(args.out)
            if args.json:
                print(job.data.model_dump_json(indent=2))
            else:
                _print_outcome(job, args.out)
        except TorchportError as exc:
            return print_refusal(exc, args.json, console)
        except TimeoutError as exc:
            console.print(f"torchport submit: {exc}")
            return EXIT_FAILED
    return job_exit_code(job.status) if wait else EXIT_OK


def _print_outcome(job: Job, out: Path | None) -> None:
    """The job's id and status; once it finished, the summary `torchport export` prints,
    from its report.json (the error with its line and hint where it failed)."""
    print(f"{job.id} {job.status}" + (" (cache hit)" if job.data.cache_hit else ""))
    if not job.done:
        return
    names = {artifact.name for artifact in job.data.artifacts}
    if "report.json" not in names:  # canceled, or lost before it wrote one
        if job.error is not None and job.status != "canceled":
            render_error(job.error, Console(stderr=True))
        return
    if out is not None:
        report = ReportDocument.model_validate_json((out / "report.json").read_text())
        render_summary(report, Console(), out)
        return
    with tempfile.TemporaryDirectory(prefix="torchport-report-") as tmp:
        wanted: list[str] = [n for n in ("report.json", "signature.json") if n in names]
        job.download(tmp, names=wanted)
        report = ReportDocument.model_validate_json((Path(tmp) / "report.json").read_text())
        signature = None
        if "signature.json" in wanted:
            text = (Path(tmp) / "signature.json").read_text()
            signature = SignatureDocument.model_validate_json(text)
    render_summary(report, Console(), None, signature)
