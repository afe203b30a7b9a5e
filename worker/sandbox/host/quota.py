"""A job's disk and inode quota, watched from the worker.

RLIMIT_FSIZE bounds one file; nothing in the kernel bounds what one job writes to a
directory of a shared file system (project quotas need a file system mounted for them;
a size-limited tmpfs holds its files in memory, and a 4 GiB program is not rare). So the
supervisor measures the job's staging directory every `disk_check_interval_s` and kills
the job past `disk_mb` or `max_inodes`: `disk_quota_exceeded`.

What is counted: the blocks allocated to every file and directory under the staging
directory (sparse files count what they hold, not their length), every inode there, and
the files the job's processes keep open after deleting them (found through
`/proc/<pid>/fd` of every process of the job — tree.py: its loaders, toolchain children
and what they started too — where the worker may read it: root, or a same-uid worker). The walk
stops as soon as either limit is passed, so a job that made a million files costs one
bounded walk. A job can overshoot by what it writes between two checks (and each file is
capped by RLIMIT_FSIZE, which the runner lowers to `disk_mb`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskUse", "measure"]


@dataclass
class DiskUse:
    """What a job holds on disk at one moment."""

    bytes: int = 0
    inodes: int = 0
    unlinked_bytes: int = 0
    """Of `bytes`: deleted files the job's processes still hold open."""
    open_files_checked: bool = False
    """Whether some process's open files could be read (else deleted ones are not seen)."""

    def peak(self, other: DiskUse) -> DiskUse:
        """The larger of each count of two measurements."""
        return DiskUse(
            max(self.bytes, other.bytes),
            max(self.inodes, other.inodes),
            max(self.unlinked_bytes, other.unlinked_bytes),
            self.open_files_checked or other.open_files_checked,
        )

    def over(self, limit_bytes: int, max_inodes: int) -> bool:
        """Whether this is past either limit."""
        return self.bytes > limit_bytes or self.inodes > max_inodes


def measure(root: Path, pids: list[int], limit_bytes: int, max_inodes: int) -> DiskUse:
    """The disk use of `root`'s tree plus the deleted files `pids` hold open (each file
    once, whoever holds it); stops counting once past a limit (the result is then a lower
    bound that is over it)."""
    use = DiskUse()
    stack = [str(root)]
    while stack and not use.over(limit_bytes, max_inodes):
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue  # removed meanwhile, or not a directory any more
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                use.inodes += 1
                use.bytes += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                if use.over(limit_bytes, max_inodes):
                    break
    seen: set[tuple[int, int]] = set()
    for pid in pids:
        _add_unlinked(use, pid, seen)
    use.bytes += use.unlinked_bytes
    return use


def _add_unlinked(use: DiskUse, pid: int, seen: set[tuple[int, int]]) -> None:
    try:
        fds = os.scandir(f"/proc/{pid}/fd")
    except OSError:
        return  # gone, or not ours to read
    with fds:
        try:
            for fd in fds:
                try:
                    info = os.stat(fd.path)  # the open file itself
                except OSError:
                    continue
                key = (info.st_dev, info.st_ino)
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and key not in seen:
                    seen.add(key)
                    use.unlinked_bytes += info.st_blocks * 512
        except OSError:
            return  # the listing itself was refused
    use.open_files_checked = True
