"""`torchport logs ID`: a job's stage events — each stage's start, progress and end, and
the job's own status changes — as recorded (`GET /v1/exports/{id}`), or with `--follow` as
they happen (`GET /v1/exports/{id}/events`) until the job ends.

One event a line: its time, stage, status, progress and message; `--json` prints each
event as one JSON object a line (`{stage, status, at, fraction, message}`), for pipelines.

Exit codes (docs/contract.md §8): 0 the job succeeded, or is queued or running (without
`--follow`); 1 it failed or was canceled; 2 refused (`not_found`, …) or the server
unreachable.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from rich.console import Console

from torchport.commands.connection import (
    add_server_arguments,
    connect,
    job_exit_code,
    print_refusal,
)
from torchport.terminal import json_text, visible

if TYPE_CHECKING:
    from schemas import StageEvent
    from torchport.client import Job

POLL_INTERVAL_S = 0.5
"""How often a followed job is read again when its event stream broke."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport logs`."""
    parser.add_argument("job_id", metavar="ID", help="the job's id")
    add_server_arguments(parser, json_help="one JSON object per event and line")
    parser.add_argument(
        "--follow", "-f", action="store_true", help="print events as they come until the job ends"
    )


def run(args: argparse.Namespace) -> int:
    """Print the job's events; returns the exit code."""
    from torchport.client import TorchportError

    err = Console(stderr=True)
    with connect(args) as client:
        try:
            job = client.get(args.job_id)
            if args.follow and not job.done:
                _follow(job, args.json)
            else:
                for event in job.data.stages:
                    _print(event, args.json)
        except TorchportError as exc:
            return print_refusal(exc, args.json, err)
        except KeyboardInterrupt:
            return job_exit_code(job.status)
    return job_exit_code(job.status)


def _follow(job: Job, as_json: bool) -> None:
    """Every event of the job, from its first, as they come; returns once it ended.

    The event stream replays the recorded events first. Should it break, the job is read
    again every `POLL_INTERVAL_S` and the events not printed yet are printed."""
    import httpx

    from schemas import StageEvent

    printed = 0
    try:
        for item in job.events():
            if isinstance(item, StageEvent):
                _print(item, as_json)
                printed += 1
    except httpx.HTTPError:
        pass
    while True:
        for event in job.data.stages[printed:]:
            _print(event, as_json)
        printed = max(printed, len(job.data.stages))
        if job.done:
            return
        time.sleep(POLL_INTERVAL_S)
        job.refresh()


def _print(event: StageEvent, as_json: bool) -> None:
    if as_json:
        print(json_text(event, indent=None), flush=True)
        return
    moment = event.at.astimezone()  # local time, as `torchport status` shows times
    when = f"{moment:%Y-%m-%d %H:%M:%S}.{moment.microsecond // 1000:03d}"
    progress = f"{event.fraction:4.0%}" if event.fraction is not None else "    "
    # one event a line: a newline in the message is shown, never starts a line of its own
    message = visible(event.message or "")
    line = f"{when}  {event.stage or '-':<11} {event.status:<9} {progress}  {message}"
    print(line.rstrip(), flush=True)
