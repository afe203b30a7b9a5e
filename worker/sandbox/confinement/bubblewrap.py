"""The bubblewrap command line the zygote runs under, when the host allows it.

All namespaces are unshared (network: only a downed `lo`; pid; ipc; uts;
cgroup; user when not root), the root is an empty tmpfs, and only what Python,
torch and our packages need is bound read-only: no /etc, no /home, no /sys
except the CPU topology torch reads, a private /proc and /dev, a size-limited
/tmp. The jobs' staging root is the only writable bind; Landlock narrows each
job to its own directory inside it.

As root, bwrap runs without a user namespace (a root-created one would map
uid 0 inside to root outside) and keeps only CAP_SETUID/SETGID/KILL, which the
zygote needs to drop each child to the unprivileged job uid and to kill it.
"""

from __future__ import annotations

import os
from pathlib import Path

from worker.sandbox.confinement.gpu import GpuAccess

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def command(
    exe: str,
    binds: list[Path],
    *,
    jobs_root: Path | None,
    tmpfs_mb: int,
    gpu: GpuAccess | None = None,
    cgroups: list[Path] | None = None,
) -> list[str]:
    """argv prefix: `bwrap ... --` (append the program to run).

    With `gpu` (a GPU worker), the private /dev also gets the NVIDIA device nodes
    (`--dev-bind`), the fresh /proc the host's view of `/proc/driver/nvidia`, and the
    driver's sysfs entries and library dirs are bound read-only; Landlock still keeps
    all of it from the worker's CPU jobs.
    """
    argv = [exe]
    if os.geteuid() == 0:
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_KILL"):
            argv += ["--cap-add", cap]
    else:
        argv += ["--unshare-all"]
    argv += ["--new-session", "--tmpfs", "/"]
    argv += ["--size", str(tmpfs_mb << 20), "--tmpfs", "/tmp"]
    for name in _SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            argv += ["--ro-bind", name, name]
    extra = ["/sys/devices/system/cpu", "/etc/ld.so.cache"]
    binds, proc_binds = list(binds), []
    if gpu is not None:
        for path in gpu.read_paths:
            if path.is_relative_to("/proc/driver"):
                # A container runtime may mask it to the pinned GPU; keep that view.
                proc_binds.append(str(path))
            elif not path.is_relative_to("/proc"):  # the fresh /proc has the rest
                binds.append(path)
    code = [str(p) for p in _unique(binds)]
    writable = [str(jobs_root)] if jobs_root is not None else []
    # The runner's cgroups (pids, memory): each job child joins its own in them.
    writable += [str(group) for group in cgroups or []]
    # bwrap creates missing parents of a bind as 0700; the job uid must traverse them.
    for parent in _parents([*code, *extra, *writable]):
        argv += ["--perms", "0755", "--dir", parent]
    for bind in [*code, *extra]:
        argv += ["--ro-bind-try", bind, bind]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for bind in proc_binds:
        argv += ["--ro-bind-try", bind, bind]
    if gpu is not None:
        for node in gpu.devices:
            argv += ["--dev-bind-try", str(node), str(node)]
    for bind in writable:
        argv += ["--bind", bind, bind]
    argv += ["--chdir", "/", "--"]
    return argv


def _parents(paths: list[str]) -> list[str]:
    """Ancestors of the given paths that the sandbox's empty root lacks, shallowest first."""
    found: set[str] = set()
    for path in paths:
        for parent in Path(path).parents:
            name = str(parent)
            if name in ("/", "/tmp") or (
                name.split("/")[1:2] and "/" + name.split("/")[1] in _SYSTEM_DIRS
            ):
                continue
            found.add(name)
    return sorted(found, key=lambda p: (p.count("/"), p))


def _unique(paths: list[Path]) -> list[Path]:
    """Drop system dirs (already bound) and paths inside other listed paths."""
    resolved = sorted({p.resolve() for p in paths if p.exists()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if any(str(path).startswith(s + "/") or str(path) == s for s in _SYSTEM_DIRS):
            continue
        if any(path.is_relative_to(k) for k in kept):
            continue
        kept.append(path)
    return kept
