"""Processes as /proc and signals show them, for both sides of the sandbox.

The worker finds the zygote and its children across bwrap's pid namespace and reads a
job's resident size; the zygote reads its own status fields, kills process groups and
closes the descriptors it passed on. Standard library only: the zygote imports this
before torch, like everything else it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal

PR_SET_CHILD_SUBREAPER = 36

__all__ = [
    "PR_SET_CHILD_SUBREAPER",
    "close_fd",
    "count_threads",
    "describe_status",
    "find_child",
    "find_outer_pid",
    "kill_group",
    "kill_strays",
    "list_children",
    "read_nspid",
    "read_rss",
    "read_status_kb",
    "read_status_mb",
]


def read_rss(pid: int) -> int:
    """The resident size of `pid` in bytes (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def read_nspid(pid: int) -> list[int]:
    """The pids of `pid` in each pid namespace it is in, outermost first."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def list_children(pid: int) -> list[int]:
    """The live children of `pid` as this process sees them."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(x) for x in handle.read().split()]
    except OSError:
        return []


def kill_strays(known: set[int]) -> list[int]:
    """SIGKILL every child of this process that is not in `known`, with its process group.

    The zygote is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process a job's helper
    left behind when it exited (a toolchain program's child) becomes the zygote's child
    instead of init's. Its group is its job's session (no process of a job may call
    `setsid` or `setpgid`), which it still belongs to, so the group's id cannot have been
    reused; an unreaped child's pid cannot either. The strays are reaped by the
    zygote's usual `waitpid(-1)`. Returns the strays' pids."""
    strays = []
    for task in _tasks(os.getpid()):
        try:
            with open(f"/proc/self/task/{task}/children") as handle:
                strays += [int(x) for x in handle.read().split() if int(x) not in known]
        except OSError:
            continue
    for pid in strays:
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return strays


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return [str(pid)]


def find_child(parent: int, inner: int) -> int | None:
    """The child of `parent` whose innermost pid is `inner`."""
    for pid in list_children(parent):
        if read_nspid(pid)[-1:] == [inner]:
            return pid
    return None


def find_outer_pid(root: int, inner: int) -> int | None:
    """The pid, as seen here, of the descendant of `root` whose innermost pid is `inner`."""
    todo = [root]
    while todo:
        pid = todo.pop()
        ns = read_nspid(pid)
        if ns and ns[-1] == inner and (len(ns) > 1 or pid == inner):
            return pid
        todo.extend(list_children(pid))
    return None


def count_threads() -> int:
    """This process's threads."""
    return len(os.listdir("/proc/self/task"))


def read_status_kb(field_name: str, path: str = "/proc/self/status") -> int:
    """A `Name:  N kB` field of this process's status (or of `path`); 0 when absent."""
    with open(path) as handle:
        for line in handle:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def read_status_mb(field_name: str) -> int:
    """A status field in MB, rounded up."""
    return read_status_kb(field_name) // 1024 + 1


def describe_status(status: int) -> str:
    """A wait status in words: `signal SIGKILL`, `exit 3`."""
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid`, and `pid` itself (gone: nothing to do)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def close_fd(fd: int | None) -> None:
    """Close `fd` unless it is None or negative, ignoring errors."""
    if fd is None or fd < 0:
        return
    with contextlib.suppress(OSError):
        os.close(fd)
