"""Every process of one job, as the worker sees them: the job child, its round-trip
loaders, its toolchain children and whatever those started (the compiler's `cc1plus`,
`as`, `ld`). Memory and disk are limits of this whole tree, not of the job child alone.

Where the job has a pids cgroup (cgroups.py: a root worker on a host that lets it make
one), its `cgroup.procs` lists them all: every one of them joined the group before its
lockdown, and what they start is born in it. Elsewhere the tree is the sessions of the
job's session leaders: each child of the zygote starts a session of its own (lockdown
calls `setsid`) and no process of a job may leave it (seccomp refuses `setsid` and
`setpgid`), so a scan of /proc for those session ids finds every descendant, reparented
ones included. The zygote names each new leader (`{"op": "helper"}`).

Memory of the tree: the job child's resident size (its budget includes the pages it
shares with the zygote, as before) plus the private memory (`Private_Clean +
Private_Dirty` of `/proc/<pid>/smaps_rollup`) of every other process: a loader forked
from the zygote shares the same pages, which summing resident sizes would count twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from worker.sandbox.processes import read_rss

__all__ = ["JobTree", "read_private", "session_members"]


@dataclass
class JobTree:
    """The processes of one running job (outer pids, as the worker sees them)."""

    group: Path | None = None
    """The job's pids cgroup; None where there is none."""
    leaders: set[int] = field(default_factory=set)
    """Session leaders: the job child, its loaders and toolchain children."""
    main: int | None = None
    """The job child."""

    def members(self) -> list[int]:
        """Every live process of the job."""
        if self.group is not None:
            try:
                text = (self.group / "cgroup.procs").read_text()
                return [int(pid) for pid in text.split()]
            except (OSError, ValueError):
                pass
        return session_members(self.leaders)

    def memory(self, members: list[int] | None = None) -> int:
        """Bytes the job's processes hold (see the module's docstring)."""
        members = self.members() if members is None else members
        total = read_rss(self.main) if self.main is not None else 0
        for pid in members:
            if pid != self.main:
                total += read_private(pid)
        return total


def read_private(pid: int) -> int:
    """The memory only `pid` holds, in bytes (0 when it cannot be read)."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return 0
    return total


def session_members(sessions: set[int]) -> list[int]:
    """The processes whose session id is one of `sessions` (a scan of /proc)."""
    if not sessions:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) in sessions:
            found.append(int(name))
    return found
