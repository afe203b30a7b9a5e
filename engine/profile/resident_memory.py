"""The process's resident memory: now, its peak over a stretch of work, and giving freed
memory back.

Linux only, read from `/proc/self`: `statm` for the resident set now, `status`'s `VmHWM`
for the kernel's high-water mark. `PeakWatch` measures the peak of a stretch (a stage, an
artifact's profile): it resets the high-water mark (`/proc/self/clear_refs` ← `5`) where
the process may write it, and then reads the exact peak; where it may not, a thread
samples the resident set every `INTERVAL_S`, and the high-water mark is still used
whenever it rose above its value at the start. Elsewhere every reading is None.

A process that is not dumpable (the sandbox's children) finds its `clear_refs` owned by
root; the sandbox opens it with `hold_reset` before it gives up root, so that the job
measures exact peaks without the sampling thread (which took the interpreter's lock from
the export every 20 ms: hundreds of context switches and ~35 ms of CPU in a transformer block's
export).

`release_free_memory` asks glibc's allocator to hand the free pages of the C heap back
(`malloc_trim(0)`); it does nothing on other C libraries.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Any

__all__ = [
    "INTERVAL_S",
    "PeakWatch",
    "high_water",
    "hold_reset",
    "release_free_memory",
    "reset_peak",
    "resident",
]

INTERVAL_S = 0.02
"""How often the resident set is sampled where the peak cannot be reset."""

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MB = 2**20


def resident() -> int | None:
    """The resident set now, in bytes (None where `/proc/self/statm` is unreadable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def high_water() -> int | None:
    """The kernel's high-water mark of the resident set (`VmHWM`), in bytes."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
    return None


_held: tuple[int, int] | None = None
"""(pid, fd) of this process's `clear_refs`, opened by `hold_reset`."""


def hold_reset() -> bool:
    """Open this process's `/proc/self/clear_refs` for `reset_peak` and keep it open
    (close-on-exec): the sandbox calls this before it drops its privileges. A forked child
    never uses its parent's (the descriptor names the process that opened it)."""
    global _held
    if _held is not None and _held[0] == os.getpid():
        return True
    try:
        fd = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    _held = (os.getpid(), fd)
    return True


def reset_peak() -> bool:
    """Set the high-water mark to the resident set now; False where it is not allowed."""
    if _held is not None and _held[0] == os.getpid():
        try:
            os.write(_held[1], b"5")
            return True
        except OSError:
            pass
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


class PeakWatch:
    """The most resident memory between `start` and `stop`, exact where the kernel's
    high-water mark could be reset at the start, sampled by a thread otherwise.

    Watches nest (a stage's around each artifact's profile): one that resets the mark
    first folds the mark so far into the open watches that had reset it too."""

    _open: list[PeakWatch] = []

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._before: int | None = None
        self._largest = 0
        self._mark: int | None = None
        self.reset = False
        """Whether `start` reset the high-water mark (the peak is then exact)."""

    def start(self, *, sample: bool = True) -> PeakWatch:
        """Begin; `sample=False` never starts the sampling thread (a peak that cannot be
        reset is then only known when it set the process's record)."""
        self._before = resident()
        if self._before is None:
            return self
        self._largest = self._before
        so_far = high_water()
        for outer in PeakWatch._open:
            if outer.reset:  # a sampling one's mark is the process's record, not its own
                outer._largest = max(outer._largest, so_far or 0)
        self.reset = reset_peak()
        self._mark = high_water()
        PeakWatch._open.append(self)
        if not self.reset and sample:
            self._thread = threading.Thread(
                target=self._sample, name="torchport-resident-memory", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> tuple[float | None, float | None]:
        """(peak, peak less the resident memory at `start`), in MB; None, None where
        unknown."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self in PeakWatch._open:
            PeakWatch._open.remove(self)
        now = resident()
        if now is None or self._before is None:
            return None, None
        peak = max(self._largest, now)
        high = high_water()
        if high is not None and self._mark is not None and (self.reset or high > self._mark):
            peak = max(peak, high)  # the mark was reset, or the record set meanwhile: exact
        return round(peak / _MB, 1), round(max(0, peak - self._before) / _MB, 1)

    def _sample(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            now = resident()
            if now is not None and now > self._largest:
                self._largest = now


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim(0)`), so that
    the next stage's peak starts from what is really in use. False where there is no
    `malloc_trim` (musl, macOS)."""
    trim = _malloc_trim()
    if not callable(trim):
        return False
    trim(0)
    return True
