"""`torchport export`: run the engine on this machine and write the artifacts.

Exit codes (docs/contract.md §8): 0 succeeded, 1 export failed (report.json holds the
error), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from engine.serialize.artifacts import ARTIFACT_NAMES, ENCODER
from engine.targets.registry import TARGET_FILES
from schemas import Environment, ErrorBody, ExportOptions, Progress, ReportDocument
from schemas.model_zip import TOKENIZER_FILES
from schemas.outcomes import error_body, validation_items
from torchport.checkpoints import UnusableAdapter, upload_path
from torchport.commands.upload_options import add_upload_arguments, requires_of
from torchport.progress_lines import ProgressLines
from torchport.summary import render_summary
from torchport.tasks import UnknownTask
from torchport.terminal import json_text, markup

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport export`."""
    add_upload_arguments(parser)
    parser.add_argument(
        "more_models",
        nargs="*",
        type=Path,
        metavar="MORE_MODELS",
        help="more model files, exported one after another by the same sandbox (each into "
        "OUT/<file name without .py>); --inputs and --weights need a single model",
    )
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
    except _UsageError as exc:
        _print_error(exc.body, args.json, err)
        return EXIT_USAGE
    if isinstance(args.model, str):  # an s3:// reference: only a server's workers read it
        body = ErrorBody(
            code="invalid_request",
            message=f"{args.model} is read by a server's workers, not on this machine",
            hint="Send it with `torchport submit`, or download the checkpoint and give its "
            "directory.",
            details={"argument": "MODEL", "reason": "reference_needs_server"},
        )
        _print_error(body, args.json, err)
        return EXIT_USAGE
    with (
        _Exporter(args, options, err) as exporter,
        tempfile.TemporaryDirectory(prefix="torchport-checkpoints-") as zips,
    ):
        if any(m.is_dir() for m in [args.model, *args.more_models]):
            # the sandbox starts (~4 s: its zygote imports torch and the engine) while the
            # checkpoint is zipped beside it (~2.6 s for a 1 GB checkpoint)
            exporter.begin()
        try:
            if args.adapter is not None and args.more_models:
                raise UnusableAdapter("--adapter belongs to one checkpoint; several were given")
            models = [
                upload_path(m, Path(zips), _say(err), adapter=args.adapter)
                for m in [args.model, *args.more_models]
            ]
        except UnusableAdapter as exc:
            body = ErrorBody(
                code="invalid_request",
                message=str(exc),
                hint="Give --adapter a directory written by PeftModel.save_pretrained, with "
                "a single checkpoint directory as MODEL.",
                details={"argument": "--adapter", "path": str(args.adapter)},
            )
            _print_error(body, args.json, err)
            return EXIT_USAGE
        # our own zips of checkpoint directories: each is moved into its job, not copied
        exporter.spent = {m for m in models if m.parent == Path(zips)}
        return _run(args, options, models, err, exporter)


def _run(
    args: argparse.Namespace,
    options: ExportOptions,
    models: list[Path],
    err: Console,
    exporter: _Exporter,
) -> int:
    try:
        if len(models) > 1 and (args.inputs or args.weights or args.calibration):
            raise _UsageError(
                ErrorBody(
                    code="invalid_request",
                    message="--inputs, --weights and --calibration belong to one model; "
                    "several were given.",
                    hint="Export models with their own inputs or weights one at a time.",
                    details={"models": [str(m) for m in models]},
                )
            )
        if len({m.stem for m in models}) < len(models):
            raise _UsageError(
                ErrorBody(
                    code="invalid_request",
                    message="Two model files have the same name; their outputs would collide.",
                    details={"models": [str(m) for m in models]},
                )
            )
        scheme = options.quantize.scheme
        if args.calibration is not None and scheme != "int8":
            raise _UsageError(
                ErrorBody(
                    code="invalid_request",
                    message=f"--calibration is read only by --quantize int8, not {scheme}.",
                    hint="Add --quantize int8, or leave --calibration out.",
                    details={"argument": "--calibration", "reason": "calibration_unused"},
                )
            )
        for path in (*models, args.inputs, args.weights, args.calibration):
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

    failed = 0
    for model in models:
        out = args.out if len(models) == 1 else args.out / model.stem
        out.mkdir(parents=True, exist_ok=True)
        if len(models) > 1 and not args.json:
            Console().rule(f"[bold]{markup(model)}")
        report = exporter.export(model, out)
        if args.json:
            print(json_text(report))
        else:
            render_summary(report, Console(), out_dir=out)
        failed += report.status != "succeeded"
    return EXIT_OK if not failed else EXIT_FAILED


def _say(console: Console) -> Callable[[str], None]:
    return lambda text: console.print(markup(text, multiline=True))


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
        requires_of(args, raw)
    except UnknownTask as exc:
        raise _UsageError(exc.body) from exc
    # The deprecated `options.callback_url` is the service's (a job's callback): accepted
    # in shared options files, meaningless here.
    raw.pop("callback_url", None)
    try:
        return ExportOptions.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _UsageError(
            error_body(
                "invalid_request",
                f"Invalid option {_dotted(first['loc'])}: {first['msg']}",
                hint="See the options table in the contract (docs/contract.md §2).",
                details={"errors": validation_items(exc.errors())},
            )
        ) from exc


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


class _Exporter:
    """Runs each model of one `torchport export` call: in this process (`--no-sandbox`) or
    in one sandbox started for all of them (its zygote starts once; the models after the
    first start warm). The sandbox starts on `begin()` in the background, or at the first
    export."""

    def __init__(self, args: argparse.Namespace, options: ExportOptions, err: Console) -> None:
        self.args, self.options, self.err = args, options, err
        self.spent: set[Path] = set()
        """Our own zips of checkpoint directories, moved into their jobs."""
        self.runner: Any = None
        self.refused: str | None = None
        self._starting: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.lines = ProgressLines(err)
        """Progress as lines where stderr is no terminal (a log, a pipe)."""

    def __enter__(self) -> _Exporter:
        if self.args.no_sandbox:
            self.err.print(
                "[bold red]WARNING: --no-sandbox runs the uploaded code unconfined in this "
                "process.[/]"
            )
        return self

    def begin(self) -> None:
        """Start the sandbox on a thread of its own (once; nothing with --no-sandbox)."""
        if self.args.no_sandbox or self._starting is not None:
            return
        from worker.sandbox import SandboxRunner, local_settings

        runner = SandboxRunner(local_settings(self.options, os.environ))
        self._starting = threading.Thread(
            target=self._start, args=(runner,), name="torchport-sandbox-start", daemon=True
        )
        self._starting.start()

    def _start(self, runner: Any) -> None:
        from worker.sandbox import SandboxUnavailable

        try:
            self.runner = runner.start()
        except SandboxUnavailable as exc:
            runner.close()
            self.refused = str(exc)
        except BaseException as exc:  # handed to the main thread by _ready
            runner.close()
            self._failure = exc

    def _ready(self) -> None:
        """Wait for the sandbox begun (or begin it now); re-raise what its start raised
        (a refusal is kept in `refused`, reported per model)."""
        self.begin()
        if self._starting is None:
            return
        if self._starting.is_alive():
            if not self.err.is_terminal:  # a log: a line, not a spinner drawn nowhere
                self.lines("sandbox", "starting the sandbox")
            with self.err.status("starting the sandbox", spinner="dots"):
                self._starting.join()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def __exit__(self, *_: object) -> None:
        if self._starting is not None:
            self._starting.join()
        if self.runner is not None:
            self.runner.close()

    def export(self, model: Path, out: Path) -> ReportDocument:
        if not self.args.no_sandbox:
            self._ready()
        with self.err.status("loading", spinner="dots") as status:

            def on_progress(event: Progress) -> None:
                # the job's own words: shown as text, never run
                status.update(f"[bold]{markup(event.stage)}[/] {markup(event.message)}")
                if not self.err.is_terminal:  # the spinner draws nothing there
                    self.lines(event.stage, event.message)

            if self.args.no_sandbox:
                return self._in_process(model, out, on_progress)
            return self._sandboxed(model, out, on_progress)

    def _in_process(self, model: Path, out: Path, on_progress: Any) -> Any:
        from engine.load.model import Upload
        from engine.pipeline.export import ExportRequest, run_export

        args = self.args
        with tempfile.TemporaryDirectory(prefix="torchport-") as work:
            request = ExportRequest(
                upload=Upload(
                    model=model,
                    inputs=args.inputs,
                    weights=args.weights,
                    calibration=args.calibration,
                ),
                options=self.options,
                out_dir=out,
                work_dir=Path(work),
            )
            return run_export(request, progress=on_progress).report

    def _sandboxed(self, model: Path, out: Path, on_progress: Any) -> Any:
        from worker.sandbox import SandboxJob, SpentFile

        # no earlier run's files here
        for name in (*ARTIFACT_NAMES, ENCODER, *TARGET_FILES, *TOKENIZER_FILES):
            (out / name).unlink(missing_ok=True)
        if self.refused is not None:
            report = _refused(self.options, self.refused)
            (out / "report.json").write_text(report.model_dump_json(indent=2))
            return report
        args = self.args
        with tempfile.TemporaryDirectory(prefix="torchport-job-") as tmp:
            job = SandboxJob(
                model=SpentFile(model) if model in self.spent else model.resolve(),
                inputs=args.inputs.resolve() if args.inputs else None,
                weights=args.weights.resolve() if args.weights else None,
                options=self.options,
                job_dir=Path(tmp),
                calibration=args.calibration.resolve() if args.calibration else None,
            )
            result = self.runner.run(job, on_progress=on_progress)
            for name, path in result.artifacts.items():
                # the worker's own copies, in a directory deleted next: moved, not copied
                # again (a renaming on the same file system; a 1.1 GB program took 2.8 s
                # to copy)
                shutil.move(path, out / name)
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
        print(json_text(body))
        return
    err.print(f"[bold red]error[/] \\[{body.code}] {markup(body.message, multiline=True)}")
    if body.hint:
        err.print(f"[bold]hint:[/] {markup(body.hint, multiline=True)}")
