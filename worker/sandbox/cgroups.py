"""A pids limit per job, in a cgroup of its own, where the host lets a root worker make one.

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
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_group(version: str) -> str | None:
    """This process's group path in the v1 `pids` hierarchy ("1") or the v2 one ("2")."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if version == "1" and "pids" in controllers.split(","):
            return path
        if version == "2" and controllers == "":
            return path
    return None


def _v1() -> Path | None:
    mount, own = CGROUP_ROOT / "pids", _own_group("1")
    if own is None or not (mount / "cgroup.procs").exists():
        return None
    return mount / own.lstrip("/")


def _v2() -> Path | None:
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        own = _own_group("2")
        if own is None or not controllers.exists():
            continue
        if "pids" not in controllers.read_text().split():
            continue
        group = mount / own.lstrip("/")
        with contextlib.suppress(OSError):
            (group / "cgroup.subtree_control").write_text("+pids")
            if "pids" in (group / "cgroup.subtree_control").read_text().split():
                return group
    return None


class JobGroups:
    """The worker's parent group and one child group per running job."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    @classmethod
    def open(cls) -> JobGroups | None:
        """A fresh parent group for this runner, or None where none can be made."""
        if os.geteuid() != 0:
            return None
        for base in (_v1(), _v2()):
            if base is None:
                continue
            _remove_stale(base)
            parent = base / f"torchport-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                parent.mkdir()
                if (parent / "cgroup.subtree_control").exists():  # v2: let jobs have pids
                    (parent / "cgroup.subtree_control").write_text("+pids")
                return cls(parent)
            except OSError:
                with contextlib.suppress(OSError):
                    parent.rmdir()
        return None

    def create(self, job_id: str, pids_max: int) -> Path | None:
        group = self.parent / f"job-{job_id}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(pids_max))
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


def join(group: Path) -> int:
    """Move this process into `group` (before it drops root); its `pids.max`.

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
    return int((group / "pids.max").read_text().strip())


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
