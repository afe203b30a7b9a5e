"""Bytes of a job's that pass through the zygote on their way back to the job: its
round-trip loader's answer, which may name the upload's symbols and outputs.

Every later job is a fork of the zygote and inherits its whole heap, freed memory
included: a Python object the zygote parsed such bytes into, and freed, stays readable
there. So the zygote never parses them or copies them into objects: they are read into
one buffer allocated for them, written on from it as they are, and zeroed before the
buffer is let go (`clear`). The job parses the line itself, within bounds
(`protocol.loads_untrusted`).
"""

from __future__ import annotations

import os
import select
import time

__all__ = ["MAX_REQUEST", "PASS_ON_S", "TOOLCHAIN", "Relay", "Requests", "UnreadAnswer"]

MAX_REQUEST = 1 << 16
"""The longest request line a job may write (a longer one kills it)."""
TOOLCHAIN = b"TOOLCHAIN"
"""What a toolchain request line starts with (then its JSON: toolchain.py)."""
PASS_ON_S = 10.0
"""How long the zygote waits for a job to read a loader's answer (up to 1 MiB, more than
its pipe holds) before it gives up on the job: the zygote serves every job."""


class UnreadAnswer(Exception):
    """The job did not read the answer it asked for within `PASS_ON_S`."""


class Relay:
    """A fixed-size buffer for one line from a loader to its job."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)
        self.length = 0

    @property
    def full(self) -> bool:
        """No room is left (a line this long is refused, not passed on)."""
        return self.length >= len(self.buffer)

    def read_from(self, fd: int) -> int:
        """Read what `fd` holds, up to the room left; 0 at end of file or when full."""
        if self.full:
            return 0
        got = os.readv(fd, [self.view[self.length :]])
        self.length += got
        return got

    def line_length(self) -> int:
        """The length of the first complete line, newline included; 0 without one."""
        return self.buffer.find(b"\n", 0, self.length) + 1

    def pass_on(self, fd: int, wait_s: float = PASS_ON_S) -> bool:
        """Write the first complete line to `fd` as it was read; False without one. A job
        gone (its pipe closed) counts as passed on. Written a pipe's page at a time when
        the pipe has room; `UnreadAnswer` when the job leaves it full for `wait_s`."""
        end = self.line_length()
        if end == 0:
            return False
        written = 0
        deadline = time.monotonic() + wait_s
        try:
            while written < end:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    raise UnreadAnswer(f"{end - written} bytes not read in {wait_s:.0f} s")
                chunk = self.view[written : min(end, written + select.PIPE_BUF)]
                written += os.write(fd, chunk)
        except UnreadAnswer:
            raise
        except OSError:
            pass
        return True

    def clear(self) -> None:
        """Zero what was read (call it before the relay is let go)."""
        self.view[: self.length] = bytes(self.length)
        self.length = 0


class Requests:
    """A job's request lines as the zygote reads them, in one buffer zeroed as they are
    used: a toolchain request (a line starting with `TOOLCHAIN`) names the job's files and
    flags, and is handed to the toolchain child as bytes, never parsed here."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)
        self.start = 0
        self.length = 0

    def read_from(self, fd: int) -> int:
        """Read what `fd` holds into the room left (compacting first); 0 at end of file
        or when a line fills the whole buffer."""
        if self.length == len(self.buffer) and self.start:
            rest = self.length - self.start
            self.view[:rest] = self.view[self.start : self.length]
            self.view[rest : self.length] = bytes(self.length - rest)
            self.start, self.length = 0, rest
        if self.length == len(self.buffer):
            return 0
        got = os.readv(fd, [self.view[self.length :]])
        self.length += got
        return got

    def next_line(self) -> memoryview | None:
        """The next complete line (without its newline), consumed; None without one."""
        end = self.buffer.find(b"\n", self.start, self.length)
        if end < 0:
            return None
        line = self.view[self.start : end]
        self.start = end + 1
        return line

    def drop_used(self) -> None:
        """Zero every line consumed so far (once nothing refers to them)."""
        self.view[: self.start] = bytes(self.start)
        if self.start == self.length:
            self.start = self.length = 0

    def clear(self) -> None:
        """Zero the whole buffer (the job is gone)."""
        self.view[: self.length] = bytes(self.length)
        self.start = self.length = 0
