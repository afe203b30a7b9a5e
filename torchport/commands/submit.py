"""`torchport submit`: send a model to a torchport server, follow it, fetch the artifacts,
and print what `torchport export` prints (the summary of its report.json).

What is sent is said on stderr first, each file with its size. A checkpoint directory
sends only regular files inside it (`torchport.checkpoints`): a link among them, a device
or pipe, or an adapter's base elsewhere on disk is a usage error, and nothing is sent.

Exit codes as `torchport export`: 0 succeeded (or submitted without --wait), 1 the export
failed or was canceled, 2 a usage error, the request was refused or the server unreachable.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from schemas import ErrorBody, ReportDocument, SignatureDocument
from torchport.checkpoints import RefusedFile, Sending, UnusableAdapter, upload_path
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
from torchport.job_view import human_size, render_error
from torchport.summary import UnreadableDocument, read_document, render_summary
from torchport.tasks import UnknownTask
from torchport.terminal import json_text, markup, visible

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
    parser.add_argument(
        "--follow-links",
        action="store_true",
        help="for a checkpoint directory: send what the symbolic links among its files "
        "point to (default: a link is refused; only regular files inside it are sent)",
    )


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
    except UnknownTask as exc:
        return _print_usage_error(exc.body, args.json, console)
    except (OSError, ValueError) as exc:
        console.print(f"torchport submit: bad --options/--dynamic-shapes: {markup(exc)}")
        return EXIT_REFUSED
    wait = args.wait or args.out is not None
    with (
        connect(args) as client,
        tempfile.TemporaryDirectory(prefix="torchport-checkpoints-") as zips,
    ):
        try:
            try:
                model: Path | str = args.model
                if isinstance(model, str) and args.adapter is not None:
                    raise UnusableAdapter(
                        "--adapter goes with a checkpoint directory; an s3:// checkpoint "
                        "carries its adapter in a sub-folder"
                    )
                if isinstance(args.model, Path):
                    model = upload_path(
                        args.model,
                        Path(zips),
                        lambda text: console.print(markup(text, multiline=True)),
                        adapter=args.adapter,
                        sending=Sending(follow_links=args.follow_links),
                    )
                _tell_uploads(args, model, console)
            except (UnusableAdapter, RefusedFile, _MissingFile) as exc:
                return _print_usage_error(_usage_error(exc, args), args.json, console)
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
                print(json_text(job.data))
            else:
                _print_outcome(job, args.out)
        except TorchportError as exc:
            return print_refusal(exc, args.json, console)
        except TimeoutError as exc:
            console.print(f"torchport submit: {markup(exc)}")
            return EXIT_FAILED
    return job_exit_code(job.status) if wait else EXIT_OK


class _MissingFile(ValueError):
    """An upload named on the command line is no file."""

    def __init__(self, argument: str, path: Path) -> None:
        super().__init__(f"{path} does not exist or is not a file")
        self.argument, self.path = argument, path


def _tell_uploads(args: argparse.Namespace, model: Path | str, console: Console) -> None:
    """Say on stderr each file about to be sent, with its size (and a checkpoint
    reference, which the server's workers read).

    Raises:
        _MissingFile: one of them is no file.
    """
    uploads = (
        ("MODEL", model),
        ("--inputs", args.inputs),
        ("--weights", args.weights),
        ("--calibration", args.calibration),
    )
    for argument, path in uploads:
        if path is None:
            continue
        if isinstance(path, str):
            console.print(markup(f"{argument}: the server's workers read {path}"))
            continue
        if not path.is_file():
            raise _MissingFile(argument, path)
        console.print(markup(f"{argument}: sending {path}, {human_size(path.stat().st_size)}"))


def _usage_error(exc: ValueError, args: argparse.Namespace) -> ErrorBody:
    """The `invalid_request` body of a usage error found before anything was sent."""
    if isinstance(exc, RefusedFile):
        return ErrorBody(
            code="invalid_request",
            message=f"{exc}; only regular files inside the directory are sent.",
            hint="Copy the file into the directory, pass --follow-links to send what links "
            "point to, or name an adapter's base: torchport submit BASE --adapter ADAPTER.",
            details=exc.details,
        )
    if isinstance(exc, _MissingFile):
        return ErrorBody(
            code="invalid_request",
            message=str(exc),
            details={"argument": exc.argument, "path": str(exc.path)},
        )
    return ErrorBody(
        code="invalid_request",
        message=str(exc),
        hint="Give --adapter a directory written by PeftModel.save_pretrained, with a "
        "checkpoint directory as MODEL.",
        details={"argument": "--adapter", "path": str(args.adapter)},
    )


def _print_usage_error(body: ErrorBody, as_json: bool, console: Console) -> int:
    """The error body on stdout with `--json`, else as `torchport export` prints it;
    returns exit 2."""
    if as_json:
        print(json_text(body))
    else:
        render_error(body, console)
    return EXIT_REFUSED


def _print_outcome(job: Job, out: Path | None) -> None:
    """The job's id and status; once it finished, the summary `torchport export` prints,
    from its report.json (the error with its line and hint where it failed)."""
    print(f"{visible(job.id)} {job.status}" + (" (cache hit)" if job.data.cache_hit else ""))
    if not job.done:
        return
    names = {artifact.name for artifact in job.data.artifacts}
    if "report.json" not in names:  # canceled, or lost before it wrote one
        if job.error is not None and job.status != "canceled":
            render_error(job.error, Console(stderr=True))
        return
    try:
        if out is not None:
            render_summary(read_document(ReportDocument, out / "report.json"), Console(), out)
            return
        with tempfile.TemporaryDirectory(prefix="torchport-report-") as tmp:
            wanted: list[str] = [n for n in ("report.json", "signature.json") if n in names]
            job.download(tmp, names=wanted)
            report = read_document(ReportDocument, Path(tmp) / "report.json")
            signature = None
            if "signature.json" in wanted:
                signature = read_document(SignatureDocument, Path(tmp) / "signature.json")
    except UnreadableDocument as exc:  # the server's writing: no summary, never a traceback
        render_error(ErrorBody(code="internal_error", message=str(exc)), Console(stderr=True))
        return
    render_summary(report, Console(), None, signature)
