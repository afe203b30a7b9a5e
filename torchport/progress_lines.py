"""A job's progress as plain lines, for output that is no terminal.

On a terminal `torchport export` and `submit` show a spinner or a bar, redrawn in place.
Redirected to a file or a CI log, those draw nothing: an export that takes two minutes
would print only what it sends, then nothing until its summary. `ProgressLines` prints
instead a line when a stage starts, and the stage's latest message at most every
`every_s` seconds while it runs, each with the seconds since the start. Every text of the
job goes through `torchport.terminal.markup`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console

from torchport.terminal import markup

__all__ = ["ProgressLines"]


class ProgressLines:
    """Prints progress to `console` as lines: each new stage at once, a stage's changed
    message at most every `every_s` seconds."""

    def __init__(
        self,
        console: Console,
        *,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.every_s, self.clock = console, every_s, clock
        self.started = clock()
        self.stage: str | None = None
        self.message: str | None = None
        self.printed_at = self.started

    def __call__(self, stage: str | None, message: str | None = None) -> None:
        """Tell of a progress event: `stage` (None: the job's own status, e.g. queued)
        and its message."""
        now = self.clock()
        fresh = stage != self.stage
        changed = bool(message) and message != self.message
        if not fresh and not (changed and now - self.printed_at >= self.every_s):
            return
        self.stage, self.message, self.printed_at = stage, message, now
        text = markup(stage or "") + (f": {markup(message)}" if message else "")
        self.console.print(f"{now - self.started:7.1f} s  {text}", soft_wrap=True)
