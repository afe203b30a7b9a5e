"""`torchport export`: run the engine on this machine and write the artifacts.

Exit codes (CONTRACT.md §6): 0 succeeded, 1 export failed (report.json holds the
error), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from engine.artifacts import ARTIFACT_NAMES
from schemas import Environment, ErrorBody, ExportOptions, Progress, ReportDocument
from torchport.commands.upload_options import add_upload_arguments
from torchport.summary import render_summary

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport export`."""
    add_upload_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("torchport-out"), help="output dir")
    parser.add_argument("--json", action="store_true", help="print report.json to stdout")
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run the upload in this process, unconfined (debugging only)",
    )


def run(args: argparse.Namespace) -> int:
    """Validate the request, run the export, print a summary; return the exit code."""
    err = Console(stderr=True)
    try:
        options = _options(args)
        for path in (args.model, args.inputs, args.weights):
            if path is not None and not path.is_file():
                raise _UsageError(
                    ErrorBody(
                        code="invalid_request",
                        message=f"{path} does not exist or is not a file.",
                        details={"path": str(path)},
                    )
                )
    except _UsageError as exc:
        _print_error(exc.body, args.json, err)
        return EXIT_USAGE

    args.out.mkdir(parents=True, exist_ok=True)
    report = _run_export(args, options, err)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render_summary(report, Console(), out_dir=args.out)
    return EXIT_OK if report.status == "succeeded" else EXIT_FAILED


class _UsageError(Exception):
    def __init__(self, body: ErrorBody) -> None:
        super().__init__(body.message)
        self.body = body


def _json_argument(text: str, what: str) -> Any:
    path = Path(text)
    try:
        if not text.lstrip().startswith(("{", "[", '"')) and path.is_file():
            text = path.read_text()
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise _UsageError(
            ErrorBody(
                code="invalid_request",
                message=f"{what} is neither valid JSON nor a readable JSON file: {exc}",
                hint="Pass JSON text or the path of a .json file.",
                details={"argument": what},
            )
        ) from exc


def _options(args: argparse.Namespace) -> ExportOptions:
    raw = _json_argument(args.options, "--options") if args.options else {}
    if not isinstance(raw, dict):
        raise _UsageError(
            ErrorBody(code="invalid_request", message="--options must be a JSON object.")
        )
    if args.dynamic_shapes:
        raw["dynamic_shapes"] = _json_argument(args.dynamic_shapes, "--dynamic-shapes")
    if args.strict:
        raw["strict"] = True
    try:
        return ExportOptions.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _UsageError(
            ErrorBody(
                code="invalid_request",
                message=f"Invalid option {_dotted(first['loc'])}: {first['msg']}",
                hint="See the options table in the contract (CONTRACT.md §2).",
                details={
                    "errors": [
                        {"field": _dotted(e["loc"]), "type": e["type"]} for e in exc.errors()
                    ]
                },
            )
        ) from exc


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _run_export(args: argparse.Namespace, options: ExportOptions, err: Console) -> ReportDocument:
    with err.status("loading", spinner="dots") as status:

        def on_progress(event: Progress) -> None:
            status.update(f"[bold]{event.stage}[/] {event.message}")

        if args.no_sandbox:
            err.print(
                "[bold red]WARNING: --no-sandbox runs the uploaded code unconfined in this "
                "process.[/]"
            )
            return _run_in_process(args, options, on_progress)
        return _run_sandboxed(args, options, on_progress)


def _run_in_process(args: argparse.Namespace, options: ExportOptions, on_progress: Any) -> Any:
    from engine.model import Upload
    from engine.pipeline import ExportRequest, run_export

    with tempfile.TemporaryDirectory(prefix="torchport-") as work:
        request = ExportRequest(
            upload=Upload(model=args.model, inputs=args.inputs, weights=args.weights),
            options=options,
            out_dir=args.out,
            work_dir=Path(work),
        )
        return run_export(request, progress=on_progress).report


def _run_sandboxed(args: argparse.Namespace, options: ExportOptions, on_progress: Any) -> Any:
    from worker.sandbox import SandboxJob, SandboxUnavailable, run_export_sandboxed

    for name in ARTIFACT_NAMES:  # never leave a previous run's program next to this report
        (args.out / name).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="torchport-job-") as tmp:
        job = SandboxJob(
            model=args.model.resolve(),
            inputs=args.inputs.resolve() if args.inputs else None,
            weights=args.weights.resolve() if args.weights else None,
            options=options.model_dump(mode="json"),
            job_dir=Path(tmp),
        )
        try:
            result = run_export_sandboxed(job, on_progress=on_progress)
        except SandboxUnavailable as exc:
            report = _refused(options, str(exc))
            (args.out / "report.json").write_text(report.model_dump_json(indent=2))
            return report
        for name, path in result.artifacts.items():
            shutil.copyfile(path, args.out / name)
        return result.report


def _refused(options: ExportOptions, why: str) -> ReportDocument:
    """The report of a job the sandbox refused to run (it never runs unconfined)."""
    import platform

    from torchport import __version__

    return ReportDocument(
        status="failed",
        error=ErrorBody(
            code="sandbox_violation",
            message=f"The sandbox cannot be set up on this machine, so nothing was run: {why}",
            hint="Run on a Linux host with seccomp, or pass --no-sandbox to run your own "
            "trusted code unconfined.",
            details={"reason": why},
        ),
        environment=Environment(
            torchport=__version__,
            python=platform.python_version(),
            platform=sys.platform,
            device=options.device,
        ),
    )


def _print_error(body: ErrorBody, as_json: bool, err: Console) -> None:
    if as_json:
        print(body.model_dump_json(indent=2))
        return
    err.print(f"[bold red]error[/] \\[{body.code}] {escape(body.message)}")
    if body.hint:
        err.print(f"[bold]hint:[/] {escape(body.hint)}")
