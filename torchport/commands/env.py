"""`torchport env`: torch and the libraries uploads can import, with their versions, and
whether each deployment target works (its packages import; for aoti, a C++ compiler).

Without `--server`, this machine's environment: the one `torchport export` jobs see
(each model library imported in a fresh isolated interpreter, as the sandbox starts
one). With `--server`, what the server's workers recorded when they started
(`GET /v1/environment`). Exit codes: 0, or 2 when the server cannot be asked.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from schemas import EnvironmentDescription
from torchport.terminal import json_text, markup


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport env`."""
    parser.add_argument("--server", help="ask this torchport server instead of looking here")
    parser.add_argument("--api-key", help="API key for --server (TORCHPORT_API_KEY)")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    parser.add_argument("--all", action="store_true", help="a row for every installed distribution")
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="versions only: skip importing the model libraries (local only)",
    )


def run(args: argparse.Namespace) -> int:
    """Describe the local or the server's environment; returns the exit code."""
    console = Console()
    if args.server:
        from torchport.client import Client, TorchportError

        try:
            with Client(args.server, args.api_key) as client:
                found = client.environment()
        except TorchportError as exc:
            message = markup(exc.message, multiline=True)
            Console(stderr=True).print(f"[red]{markup(exc.code)}[/red]: {message}")
            return 2
        if args.json:
            print(json_text(found))
            return 0
        if not found.workers:
            console.print("No worker has recorded its environment yet.")
        for worker in found.workers:  # what the server says is shown as text, never run
            console.print(
                f"[bold]queue {markup(worker.queue)}[/]: worker {markup(worker.hostname)}, "
                f"started {worker.recorded_at:%Y-%m-%d %H:%M:%S %Z}"
            )
            render(worker.environment, console, every=args.all)
        return 0

    from engine.environment.libraries import describe_environment

    with Console(stderr=True).status("checking which model libraries import", spinner="dots"):
        described = describe_environment(check=not args.no_check)
    if args.json:
        print(described.model_dump_json(indent=2))
    else:
        render(described, console, every=args.all)
    return 0


def render(described: EnvironmentDescription, console: Console, *, every: bool) -> None:
    """The model libraries as a table (whether each loads, and why not), then the rest."""
    console.print(
        markup(
            f"Python {described.python} on {described.platform}; torch "
            f"{described.torch or 'not installed'}; torchport {described.torchport or '?'}"
        )
    )
    table = Table(title="Model libraries", title_justify="left")
    table.add_column("library")
    table.add_column("version")
    table.add_column("imports")
    table.add_column("why not", overflow="fold")
    others = []
    for library in described.libraries:
        if not library.model_library and not every:
            others.append(library)
            continue
        loads = {True: "[green]yes[/]", False: "[red]no[/]", None: "not checked"}[library.imports]
        if library.version is None:
            loads = "[dim]—[/]"
        version = library.version or "not installed"
        table.add_row(markup(library.name), markup(version), loads, markup(library.error or ""))
    console.print(table)
    if described.targets:
        targets = Table(title="Deployment targets", title_justify="left")
        targets.add_column("target")
        targets.add_column("works")
        targets.add_column("why not", overflow="fold")
        for target in described.targets:
            works = {True: "[green]yes[/]", False: "[red]no[/]", None: "not checked"}[target.works]
            why = ", ".join(f"{m} missing" for m in target.missing) or target.error or ""
            targets.add_row(markup(target.name), works, markup(why))
        console.print(targets)
    if others:
        console.print(
            f"{len(others)} more installed (--all lists them): "
            + markup(", ".join(f"{lib.name} {lib.version}" for lib in others))
        )
