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

__all__ = ["Relay"]


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

    def pass_on(self, fd: int) -> bool:
        """Write the first complete line to `fd` as it was read; False without one. A job
        gone (its pipe closed) counts as passed on."""
        end = self.line_length()
        if end == 0:
            return False
        written = 0
        try:
            while written < end:
                written += os.write(fd, self.view[written:end])
        except OSError:
            pass
        return True

    def clear(self) -> None:
        """Zero what was read (call it before the relay is let go)."""
        self.view[: self.length] = bytes(self.length)
        self.length = 0
