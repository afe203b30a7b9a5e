"""A pids limit and a memory limit per job, each in a cgroup of its own, where the host
lets a root worker make one.

RLIMIT_NPROC counts per uid, and threads count as processes: it limits a job only
when no other process shares its uid (see settings.slot_uid_base), and never bounds
what all jobs together take from the kernel's pid space. The `pids` controller does:
each job (and its round-trip loader) runs in `<worker's group>/job-<id>` with
`pids.max`, and a job that parks thousands of threads exhausts only its own group.

cgroup v1 (a `pids` hierarchy, as on this project's machines) and v2 where the worker
sits in a group that may have children with the `pids` controller. Elsewhere (a
non-root worker, a container without a writable cgroup fs) there is none, and
`report.sandbox.details.in_force` says so by having no `pids_max`.

The job child joins its group itself, while still root and before any of the upload's
code runs (`lockdown.apply` writes 0 to `cgroup.procs`); Landlock then keeps it away.

A v1 `memory` hierarchy (as on this project's machines) gives each job a second group with
`memory.limit_in_bytes`, which every process of the job joins like the pids group: the kernel
then bounds what the whole tree holds (the watchdog, tree.py, usually stops it first, and
names it; a kernel OOM kill in the group is `out_of_memory` too, `oom_kills`). On a
cgroup v2 host a process is in one group only, so there the job's pids group would have to
carry `memory.max` too: not done yet (the watchdog is the bound there).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_group(version: str, controller: str = "pids") -> str | None:
    """This process's group path in the v1 hierarchy of `controller` ("1") or the v2 one
    ("2")."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if version == "1" and controller in controllers.split(","):
            return path
        if version == "2" and controllers == "":
            return path
    return None


def _v1(controller: str) -> Path | None:
    mount, own = CGROUP_ROOT / controller, _own_group("1", controller)
    if own is None or not (mount / "cgroup.procs").exists():
        return None
    return mount / own.lstrip("/")


def _v2(controller: str) -> Path | None:
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        own = _own_group("2")
        if own is None or not controllers.exists():
            continue
        if controller not in controllers.read_text().split():
            continue
        group = mount / own.lstrip("/")
        with contextlib.suppress(OSError):
            (group / "cgroup.subtree_control").write_text("+" + controller)
            if controller in (group / "cgroup.subtree_control").read_text().split():
                return group
    return None


class JobGroups:
    """The worker's parent group of one controller (`pids` or `memory`) and one child
    group per running job."""

    def __init__(self, parent: Path, controller: str = "pids") -> None:
        self.parent = parent
        self.controller = controller

    @classmethod
    def open(cls, controller: str = "pids") -> JobGroups | None:
        """A fresh parent group for this runner, or None where none can be made."""
        if os.geteuid() != 0:
            return None
        # A v2 process is in one group of one hierarchy: a second group per job for memory
        # would take it out of its pids group. Memory groups are v1's only (for now).
        bases = (_v1(controller), _v2(controller)) if controller == "pids" else (_v1(controller),)
        for base in bases:
            if base is None:
                continue
            _remove_stale(base)
            parent = base / f"torchport-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                parent.mkdir()
                if (parent / "cgroup.subtree_control").exists():  # v2: let jobs have it
                    (parent / "cgroup.subtree_control").write_text("+" + controller)
                return cls(parent, controller)
            except OSError:
                with contextlib.suppress(OSError):
                    parent.rmdir()
        return None

    def create(self, job_id: str, limit: int) -> Path | None:
        """The job's group with its limit (`pids.max`, or the memory limit in bytes)."""
        group = self.parent / f"job-{job_id}"
        try:
            group.mkdir()
            (group / _limit_file(group, self.controller)).write_text(str(limit))
        except OSError:
            self.remove(group)
            return None
        return group

    @staticmethod
    def remove(group: Path) -> bool:
        """Remove a job's group once its processes are gone; False while some remain."""
        try:
            group.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def close(self) -> None:
        for group in self.parent.glob("job-*"):
            self.remove(group)
        self.remove(self.parent)


def _limit_file(group: Path, controller: str) -> str:
    if controller == "pids":
        return "pids.max"
    return "memory.max" if (group / "memory.max").exists() else "memory.limit_in_bytes"


def limit(group: Path) -> dict[str, int]:
    """What `group` bounds, for the report: `{"pids_max": N}` or `{"memory_max_mb": N}`."""
    if (group / "pids.max").exists():
        return {"pids_max": int((group / "pids.max").read_text().strip())}
    value = (group / _limit_file(group, "memory")).read_text().strip()
    return {"memory_max_mb": int(value) >> 20} if value.isdigit() else {}


def oom_kills(group: Path) -> int:
    """How many processes the kernel's OOM killer killed in a memory `group` (0 when it
    cannot tell): `oom_kill` of `memory.oom_control` (v1) or `memory.events` (v2)."""
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError, ValueError):
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def join(group: Path) -> int:
    """Move this process into `group` (before it drops root); its `pids.max` (0 for a
    memory group).

    Writing `cgroup.procs` moves a whole thread group under the kernel's global
    `cgroup_threadgroup_rwsem`, whose write side waits for an RCU grace period: 5-20 ms
    here, paid by every job child and every loader on the job's critical path (its joins
    are too far apart to share one grace period). Moving one thread, the caller itself,
    takes no such lock (~0.3 ms): a single-threaded process (every fork of the zygote;
    forks copy only the calling thread) therefore joins through cgroup v1's `tasks`
    file. With one thread, that thread is the whole process, and it starts no other
    before the move is done: everything it creates later is born in the group. A process
    with more threads, or a cgroup v2 group (no `tasks` file; `cgroup.threads` only in
    threaded subtrees), moves all of its threads through `cgroup.procs`.
    """
    tasks = group / "tasks"
    if _threads() == 1 and tasks.exists():
        tasks.write_text("0")
        if _threads() != 1:  # cannot happen (see above); never leave a thread outside
            (group / "cgroup.procs").write_text("0")
    else:
        (group / "cgroup.procs").write_text("0")
    return limit(group).get("pids_max", 0)


def _threads() -> int:
    """This process's threads (0 when /proc cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _remove_stale(base: Path) -> None:
    """Groups of runners whose process is gone (killed before `close`); empty ones go."""
    for parent in base.glob("torchport-*-*"):
        pid = parent.name.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            for group in parent.glob("job-*"):
                JobGroups.remove(group)
            JobGroups.remove(parent)
