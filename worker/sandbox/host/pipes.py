"""The two pipes of a running job, as the worker reads them: progress (JSON lines the
job child writes, parsed as untrusted data into the job's `Watch` and progress
callbacks) and output (its stdout and stderr, kept in a capped log).

One reader thread per job drains both until they close, whatever the job writes.
"""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
from collections.abc import Callable
from pathlib import Path

from schemas import Progress
from worker.sandbox import protocol
from worker.sandbox.host.supervisor import Watch

__all__ = [
    "IN_FORCE",
    "LOG",
    "REFUSAL_CODES",
    "TAIL_BYTES",
    "CappedLog",
    "ProgressCallback",
    "drain",
    "read_progress_line",
]

ProgressCallback = Callable[[Progress], None]

LOG = "sandbox.log"
TAIL_BYTES = 8192

IN_FORCE = {"uid", "no_new_privs", "landlock_abi", "seccomp", "gpu", "pids_max", "memory_max_mb"}
"""The keys of a job's `lockdown` line the worker keeps (report details.in_force)."""
REFUSAL_CODES = {"sandbox_violation", "invalid_request", "out_of_memory"}
"""The codes a job child may refuse a job with; anything else is a sandbox_violation."""


class CappedLog:
    """The job's stdout/stderr: the first `limit` bytes on disk, the last few kept."""

    def __init__(self, path: Path, limit: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("wb")
        self.left = limit
        self.last: collections.deque[bytes] = collections.deque()
        self.last_size = 0
        self.dropped = 0

    def write(self, data: bytes) -> None:
        if self.left > 0:
            self.file.write(data[: self.left])
            self.left -= min(len(data), self.left)
        else:
            self.dropped += len(data)
        self.last.append(data[-TAIL_BYTES:])
        self.last_size += len(self.last[-1])
        while self.last_size - len(self.last[0]) >= TAIL_BYTES:
            self.last_size -= len(self.last.popleft())

    def tail(self) -> str:
        text = b"".join(self.last)[-TAIL_BYTES:].decode(errors="replace")
        return text if not self.dropped else f"[{self.dropped} bytes not kept]\n{text}"

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def drain(
    progress_fd: int,
    output_fd: int,
    watch: Watch,
    log: CappedLog,
    on_progress: ProgressCallback | None,
    limit: int,
) -> None:
    """Read the job's progress lines (each at most `limit` bytes) and output until both
    pipes close. Before each read of progress, what output is waiting is logged: a line
    (`done` above all) then comes after everything the job printed before it."""
    pending = b""
    open_fds = {progress_fd, output_fd}
    os.set_blocking(output_fd, False)
    with contextlib.ExitStack() as closing, selectors.DefaultSelector() as selector:
        # Whatever happens in here, both pipes end up closed (never a leaked fd, never a
        # job blocked on a full pipe nobody reads).
        for fd in (progress_fd, output_fd):
            closing.callback(_close_fd, fd, open_fds)
        selector.register(progress_fd, selectors.EVENT_READ, "progress")
        selector.register(output_fd, selectors.EVENT_READ, "output")
        while open_fds:
            for key, _ in selector.select():
                fd = key.fd
                if key.data == "progress" and output_fd in open_fds:
                    _log_waiting(output_fd, log)
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:  # the output, read by _log_waiting meanwhile
                    continue
                if not data:
                    selector.unregister(fd)
                    os.close(fd)
                    open_fds.discard(fd)
                    continue
                if key.data == "output":
                    log.write(data)
                    continue
                pending += data
                *lines, pending = pending.split(b"\n")
                if len(pending) > limit:
                    pending = b""
                    watch.bad_lines += 1
                for line in lines:
                    read_progress_line(line, watch, on_progress, limit)


def read_progress_line(
    line: bytes, watch: Watch, on_progress: ProgressCallback | None, limit: int
) -> None:
    """Take one line of the progress pipe into `watch` (or pass it to `on_progress`);
    anything malformed counts as a bad line."""
    try:
        message = protocol.loads_untrusted(line, limit)
        if "progress" in message:
            progress = Progress.model_validate(message["progress"])
            if progress.stage in protocol.QUIET_STAGES and not watch.quiet:
                watch.quiet = True  # the zygote may fork the spares it owes (spares.py)
                watch.messages.put({"op": "quiet"})
            if on_progress is not None:
                with contextlib.suppress(Exception):
                    on_progress(progress)
        elif "lockdown" in message and watch.lockdown is None:
            watch.lockdown = {k: v for k, v in dict(message["lockdown"]).items() if k in IN_FORCE}
        elif message.get("done") is True and not watch.done:
            watch.done = True
            watch.messages.put({"op": "done"})
        elif "refused" in message and watch.refused is None:
            code = str(message["refused"])
            code = code if code in REFUSAL_CODES else "sandbox_violation"
            watch.refused = (code, str(message.get("message", ""))[:2000])
        else:
            watch.bad_lines += 1
    except Exception:  # whatever a job writes, the worker's reader lives on
        watch.bad_lines += 1


def _log_waiting(fd: int, log: CappedLog) -> None:
    """Log what the output pipe holds now, without waiting (its end is left to the
    loop), a pipe's worth or so at most: a job writing without pause cannot hold up its
    progress lines."""
    for _ in range(4):
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            return
        log.write(data)


def _close_fd(fd: int, still_open: set[int]) -> None:
    if fd in still_open:
        still_open.discard(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
