"""`torchport` command line: one subcommand per module in `torchport.commands`.

Subcommand modules are imported only when chosen, so `torchport submit` never
imports torch and `torchport export` never imports the web stack.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

SUBCOMMANDS: dict[str, str] = {
    "export": "Export a model locally (same engine and sandbox as the workers).",
    "serve": "Run the whole service on this machine with embedded defaults.",
    "worker": "Run a production Celery worker.",
    "submit": "Submit a model to a torchport server and fetch the result.",
    "status": "Show a job of a torchport server (--wait follows it to its end).",
    "list": "List your jobs on a torchport server, newest first.",
    "cancel": "Cancel a job on a torchport server.",
    "download": "Download a finished job's artifacts from a torchport server.",
    "logs": "Print a job's stage events (--follow: as they come, until it ends).",
    "env": "List torch and the libraries uploads can import, with versions.",
    "keys": "Create or revoke API keys.",
    "db": "Migrate the database to the newest schema (db upgrade).",
    "gc": "Delete the uploads and artifacts of jobs past their retention time.",
}

MODULES = {"list": "listing"}
"""Subcommands whose module has another name (`list` would shadow the builtin)."""

USAGE_ERROR = 2


def _command_module(name: str) -> types.ModuleType:
    return importlib.import_module(f"torchport.commands.{MODULES.get(name, name)}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser; only the chosen subcommand's module is imported to add its options."""
    parser = argparse.ArgumentParser(prog="torchport", description="PyTorch export as a service.")
    from torchport import __version__

    parser.add_argument("--version", action="version", version=f"torchport {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help_text in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            try:
                module = _command_module(name)
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.startswith("torchport.commands"):
                    continue
                raise
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `torchport` console script; returns the exit code."""
    args_list = sys.argv[1:] if argv is None else argv
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return USAGE_ERROR
    return int(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
