"""Concurrency slots leased machine-wide, so that no two running jobs share a uid.

A root worker drops each job to the uid of the slot it holds (`SandboxSettings.job_ids`:
slot 0 runs as `uid`, 65534 by default; slot k as `slot_uid_base + k`). The kernel keys
RLIMIT_NPROC, signals and `/proc` access by uid, so two jobs of one uid could reach each
other. Slots counted per runner were not enough: `torchport serve --workers N` runs N
worker processes, each with a runner of its own, and their first jobs all ran as 65534.

A slot is an exclusive `flock` on `<directory>/<k>.lock`, taken non-blocking from k = 0
up and held for the job's life. Locks of separate open files conflict even within one
process, so threads of one runner and runners of other processes draw from the same
pool; the kernel drops a dead worker's locks with its process, so no slot leaks.

The directory is private to the worker's user (0700, owned by it, no symlink): a job
cannot reach it (Landlock, bubblewrap), nor could another local user hold slots.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Slot", "SlotLeases", "default_directories"]

MAX_SLOTS = 4096


def default_directories() -> list[Path]:
    """Where the machine's slot locks live, first usable wins: `/run/torchport/slots`
    (root), then a per-user directory in the system's temporary directory."""
    return [
        Path("/run/torchport/slots"),
        Path(tempfile.gettempdir()) / f"torchport-slots-{os.geteuid()}",
    ]


@dataclass
class Slot:
    """A held slot: its number and the open lock file that holds it."""

    number: int
    fd: int | None


class SlotLeases:
    """Takes and releases the machine's concurrency slots."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def open(cls, candidates: list[Path]) -> SlotLeases:
        """Leases in the first candidate directory that is (or can be made) private to
        this user.

        Raises:
            OSError: none of them can be used.
        """
        failures: list[str] = []
        for candidate in candidates:
            try:
                return cls(_private_directory(candidate))
            except OSError as exc:
                failures.append(f"{candidate}: {exc}")
        raise OSError("no private directory for the slot locks: " + "; ".join(failures))

    def take(self) -> Slot:
        """The lowest slot no running job on this machine holds.

        Raises:
            OSError: all MAX_SLOTS slots are held, or the lock files cannot be opened.
        """
        for number in range(MAX_SLOTS):
            path = self.directory / f"{number}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return Slot(number, fd)
        raise OSError(f"all {MAX_SLOTS} job slots of this machine are held")

    @staticmethod
    def release(slot: Slot) -> None:
        """Give the slot back (closing the lock file drops the lock)."""
        if slot.fd is not None:
            with contextlib.suppress(OSError):
                os.close(slot.fd)
            slot.fd = None


def _private_directory(path: Path) -> Path:
    """`path` as a directory owned by this user with mode 0700 (created if missing).

    Raises:
        OSError: it is a symlink, not a directory, or owned by someone else.
    """
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"{path} is owned by uid {info.st_uid}, not by this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path
