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

After the job (`sweep`): nothing of it may be left when its uid goes to the next job. The
zygote kills what its helpers leave behind as they exit (it is their subreaper:
processes.kill_strays); the worker then kills, and waits out, every process still in the
job's cgroup, in its sessions, or of its uid below the zygote (any process of the uid,
for the slots' own uids), and gives the slot back only when a scan finds none.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from worker.sandbox.processes import read_rss

__all__ = ["JobTree", "Process", "read_private", "scan", "session_members"]


@dataclass
class JobTree:
    """The processes of one running job (outer pids, as the worker sees them)."""

    group: Path | None = None
    """The job's pids cgroup; None where there is none."""
    leaders: set[int] = field(default_factory=set)
    """Session leaders: the job child, its loaders and toolchain children."""
    main: int | None = None
    """The job child."""
    anchor: int | None = None
    """The zygote, whose subtree the job's processes stay in."""

    def members(self) -> list[int]:
        """Every live process of the job."""
        if self.group is not None:
            try:
                text = (self.group / "cgroup.procs").read_text()
                return [int(pid) for pid in text.split()]
            except (OSError, ValueError):
                pass
        return session_members(self.leaders)

    def leftovers(self, uid: int | None, *, any_of_uid: bool) -> list[int]:
        """The processes of the job still alive: in its cgroup, in its sessions (of its uid,
        where it has one of its own), or of its uid below the zygote (`anchor`); with
        `any_of_uid`, every process of the uid wherever it is."""
        table = scan()
        group = set(self._group_members())
        found = []
        for proc in table.values():
            ours = uid is None or uid in proc.uids
            in_tree = proc.pid in group or (ours and proc.sid in self.leaders)
            of_uid = uid is not None and ours and (any_of_uid or self._below_anchor(proc, table))
            if in_tree or of_uid:
                found.append(proc.pid)
        return found

    def sweep(self, uid: int | None, *, any_of_uid: bool, timeout: float) -> list[int]:
        """Kill the job's leftovers until a scan finds none; the pids still found after
        `timeout` (processes that do not die: the caller keeps the uid out of use)."""
        deadline = time.monotonic() + timeout
        while found := self.leftovers(uid, any_of_uid=any_of_uid):
            if time.monotonic() > deadline:
                return found
            for pid in found:
                _kill_checked(pid, uid)
            time.sleep(0.01)
        return []

    def _group_members(self) -> list[int]:
        if self.group is None:
            return []
        try:
            return [int(pid) for pid in (self.group / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def _below_anchor(self, proc: Process, table: dict[int, Process]) -> bool:
        seen = 0
        while proc.ppid > 1 and seen < 4096:
            if proc.ppid == self.anchor:
                return True
            parent = table.get(proc.ppid)
            if parent is None:
                return False
            proc, seen = parent, seen + 1
        return False

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


@dataclass(frozen=True)
class Process:
    """One process as /proc shows it to the worker."""

    pid: int
    ppid: int
    sid: int
    uids: tuple[int, ...]
    """Real, effective, saved and filesystem uid."""


def scan() -> dict[int, Process]:
    """Every process on the machine the worker can see, by pid."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := _read(int(name))) is not None:
            found[proc.pid] = proc
    return found


def _read(pid: int) -> Process | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        with open(f"/proc/{pid}/status") as handle:
            uids = next((line.split()[1:] for line in handle if line.startswith("Uid:")), [])
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # pid (comm) state ppid pgrp session
    try:
        return Process(pid, int(fields[1]), int(fields[3]), tuple(int(u) for u in uids))
    except (IndexError, ValueError):
        return None


def _kill_checked(pid: int, uid: int | None) -> None:
    """SIGKILL `pid` through a pidfd, after checking through it that it is still a process
    of `uid` (a pid read from /proc may have been reused since)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        proc = _read(pid)  # the pidfd pins the process: /proc/<pid> is it or nothing
        if proc is not None and (uid is None or uid in proc.uids):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
