"""`torchport submit`: send a model to a torchport server, follow it, fetch the artifacts.

Exit codes as `torchport export`: 0 succeeded (or submitted without --wait), 1 the export
failed or was canceled, 2 the request was refused or the server unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from schemas import STAGES
from torchport.checkpoints import UnusableAdapter, upload_path
from torchport.commands.upload_options import add_upload_arguments, requires_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport submit`."""
    add_upload_arguments(parser)
    parser.add_argument("--server", help="server URL (TORCHPORT_SERVER, default 127.0.0.1:8000)")
    parser.add_argument("--api-key", help="API key (TORCHPORT_API_KEY)")
    parser.add_argument(
        "--callback-url", help="POSTed the job, signed, when it ends (http:// or https://)"
    )
    parser.add_argument("--wait", action="store_true", help="wait for the job to finish")
    parser.add_argument("--out", type=Path, help="download the artifacts here (implies --wait)")
    parser.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    parser.add_argument("--json", action="store_true", help="print the job as JSON")


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
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from torchport.client import Client, TorchportError

    console = Console(stderr=True)
    try:
        options = _options(args)
    except (OSError, ValueError) as exc:
        console.print(f"torchport submit: bad --options/--dynamic-shapes: {exc}")
        return 2
    wait = args.wait or args.out is not None
    with (
        Client(args.server, args.api_key) as client,
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
                return 2
            job = client.submit(
                model,
                inputs=args.inputs,
                weights=args.weights,
                options=options or None,
                callback_url=args.callback_url,
            )
            if wait and not job.done:
                with Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TimeElapsedColumn(),
                    console=console,
                    disable=args.json or not console.is_terminal,
                ) as bar:
                    task = bar.add_task(f"{job.id[:8]} queued", total=len(STAGES))

                    def on_event(event: Any) -> None:
                        done = STAGES.index(event.stage) if event.stage in STAGES else 0
                        bar.update(
                            task,
                            completed=done,
                            description=f"{job.id[:8]} {event.stage or event.status}",
                        )

                    job.wait(timeout=args.timeout, on_event=on_event)
                    bar.update(
                        task, completed=len(STAGES), description=f"{job.id[:8]} {job.status}"
                    )
            if args.out is not None and job.done:
                job.download(args.out)
        except TorchportError as exc:
            if args.json:
                print(
                    json.dumps(
                        exc.body.model_dump(mode="json")
                        if exc.body
                        else {"code": exc.code, "message": exc.message}
                    )
                )
            else:
                console.print(f"[red]{exc.code}[/red]: {exc.message}")
            return 2
        except TimeoutError as exc:
            console.print(f"torchport submit: {exc}")
            return 1
    if args.json:
        print(job.data.model_dump_json(indent=2))
    else:
        line = f"{job.id} {job.status}" + (" (cache hit)" if job.data.cache_hit else "")
        print(line)
        if job.error is not None:
            print(f"{job.error.code}: {job.error.message}", file=sys.stderr)
            if job.error.hint:
                print(f"hint: {job.error.hint}", file=sys.stderr)
        if args.out is not None and job.done:
            print(f"artifacts in {args.out}")
    if not wait:
        return 0
    return 0 if job.status == "succeeded" else 1
