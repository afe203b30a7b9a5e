"""What a job child does to itself, after fork and before any uploaded code runs.

Order matters: session and fds first, then rlimits and environment, then the uid
drop (which clears the parent-death signal, so that is set after it), then
`PR_SET_NO_NEW_PRIVS`, Landlock and, last, seccomp (which forbids some of the
calls made before it). Any failure raises `LockdownError`; the child then
refuses the job instead of running it with less isolation.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import signal
from dataclasses import dataclass, field
from pathlib import Path

from engine.profile import resident_memory
from worker.sandbox.confinement import landlock, seccomp
from worker.sandbox.confinement.gpu import GpuAccess

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

MIB = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


class LockdownError(RuntimeError):
    """A layer that must be in force could not be put in force."""


@dataclass
class Limits:
    """Resource limits of one child."""

    memory_mb: int
    cpu_s: int
    fsize_mb: int
    nofile: int
    nproc: int


@dataclass
class Confinement:
    """Everything the child applies to itself; built by the zygote from the job."""

    limits: Limits
    read_paths: list[Path]
    write_paths: list[Path]
    scratch: Path
    uid: int | None = None
    gid: int | None = None
    landlock: bool = True
    keep_fds: dict[int, int] = field(default_factory=dict)
    """Target fd → current fd; everything else is closed."""
    gpu: GpuAccess | None = None
    """A CUDA job's extra devices, paths and variables (gpu.py); None for every other job."""
    cgroups: list[Path] = field(default_factory=list)
    """The job's own cgroups (cgroups.py: pids, memory), joined while still root; empty
    where the host has none for the worker."""
    executables: list[Path] = field(default_factory=list)
    """Files the child may execute (a deployment target's compiler and its helpers); with
    any, seccomp allows execve and process creation and Landlock allows executing exactly
    these. Only a toolchain child (toolchain.py) has any: a job child, whatever its
    targets, executes nothing."""
    inert_mode_calls: bool = False
    """The chmod family answers success and changes nothing (instead of EPERM): for a job
    converting to a target whose tools chmod what they write (torch's inductor chmods its
    cache entries), and for its toolchain children."""


def prctl(option: int, arg: int) -> None:
    """`prctl(option, arg, 0, 0, 0)`, raising on failure."""
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_dumpable(flag: bool) -> None:
    """Mark this process (not) dumpable: non-dumpable processes' /proc files and
    memory are closed to other processes of the same uid, and to ptrace."""
    prctl(PR_SET_DUMPABLE, int(flag))


def environment(scratch: Path, gpu: GpuAccess | None = None) -> dict[str, str]:
    """The whole environment a job sees: nothing of the worker's. A CUDA job also gets
    the worker's configured GPU pinning and a CUDA kernel cache in its scratch dir."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "LANG": "C.UTF-8",
        "TMPDIR": str(scratch),
        # getpass.getuser() (used by torch's cache directories) reads these first,
        # so it never needs a password database the sandbox does not have.
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)),
        "PYTHONHASHSEED": "0",
    }
    if gpu is not None:
        env.update(gpu.environment)
        env["CUDA_CACHE_PATH"] = str(scratch / "cuda-cache")
    return env


def apply(conf: Confinement) -> dict[str, object]:
    """Lock this (freshly forked) process down; returns what is in force."""
    os.setsid()
    _arrange_fds(conf.keep_fds)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    _set_limits(conf.limits)
    # Its peak memory per stage, exact and without a sampling thread, once it is no
    # longer root (its /proc/self files belong to root: it is not dumpable).
    resident_memory.hold_reset()
    os.environ.clear()
    os.environ.update(environment(conf.scratch, conf.gpu))
    import tempfile

    tempfile.tempdir = str(conf.scratch)
    in_force: dict[str, object] = {}
    if conf.cgroups:
        from worker.sandbox.confinement import cgroups

        for group in conf.cgroups:
            try:
                cgroups.join(group)
                in_force.update(cgroups.limit(group))
            except (OSError, ValueError) as exc:
                raise LockdownError(f"could not join the job's cgroup {group}: {exc}") from exc
    if os.geteuid() == 0 or os.getuid() == 0:
        if conf.uid is None or conf.gid is None or conf.uid == 0:
            raise LockdownError("running as root and no unprivileged uid/gid configured")
        os.setgroups([])
        os.setresgid(conf.gid, conf.gid, conf.gid)
        os.setresuid(conf.uid, conf.uid, conf.uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise LockdownError("could not leave uid 0")
    in_force["uid"] = os.getuid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    in_force["no_new_privs"] = True
    if conf.landlock:
        try:
            in_force["landlock_abi"] = landlock.restrict(
                *landlock_rules(conf, os.getpid()), executables=conf.executables
            )
        except OSError as exc:
            raise LockdownError(f"Landlock could not be installed: {exc}") from exc
    try:
        seccomp.install(
            os.getpid(),
            gpu=conf.gpu is not None,
            exec_programs=bool(conf.executables),
            inert_mode_calls=conf.inert_mode_calls or bool(conf.executables),
        )
    except Exception as exc:
        raise LockdownError(f"seccomp could not be installed: {exc}") from exc
    in_force["seccomp"] = True
    if conf.gpu is not None:
        # What the child itself sees, for the report: the GPU pinning it runs with, how
        # many device nodes it may open, and the names of its whole environment.
        in_force["gpu"] = {
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_nodes": len(conf.gpu.devices),
            "environment": sorted(os.environ),
        }
    return in_force


def landlock_rules(
    conf: Confinement, pid: int
) -> tuple[list[Path], list[Path], list[Path], list[Path]]:
    """Landlock's (read, write, devices, ioctl devices) for a child with this pid."""
    devices = [Path("/dev/null"), Path("/dev/zero"), Path("/dev/urandom")]
    reads = [*conf.read_paths, Path(f"/proc/{pid}"), Path("/proc/cpuinfo")]
    writes = list(conf.write_paths)
    ioctl_devices: list[Path] = []
    if conf.gpu is not None:
        reads += conf.gpu.read_paths
        ioctl_devices += conf.gpu.devices
        # The CUDA driver names the threads it starts (pthread_setname_np writes
        # /proc/<pid>/task/<tid>/comm) and fails to initialize, error 304, when it cannot
        # (measured on an H100, driver 580). The job's own threads only.
        writes.append(Path(f"/proc/{pid}/task"))
    return reads, writes, devices, ioctl_devices


def _arrange_fds(keep: dict[int, int]) -> None:
    # Lift every kept fd out of the way first, so that dup2 never clobbers one.
    staged = {
        target: fcntl.fcntl(current, fcntl.F_DUPFD_CLOEXEC, 256) for target, current in keep.items()
    }
    top = max([*keep, 2]) + 1
    os.closerange(0, top)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in range(top):
        os.dup2(staged.get(fd, null), fd, inheritable=True)
    os.closerange(top, max_fd())


def max_fd() -> int:
    """Past the highest descriptor this process may hold (its RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 65536


def _set_limits(limits: Limits) -> None:
    def both(kind: int, value: int) -> None:
        resource.setrlimit(kind, (value, value))

    both(resource.RLIMIT_CORE, 0)
    both(resource.RLIMIT_DATA, limits.memory_mb * MIB)
    # Soft CPU limit first (SIGXCPU), the hard one a second later (SIGKILL).
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    both(resource.RLIMIT_FSIZE, limits.fsize_mb * MIB)
    both(resource.RLIMIT_NOFILE, limits.nofile)
    both(resource.RLIMIT_NPROC, limits.nproc)
    both(resource.RLIMIT_MEMLOCK, 0)
    both(resource.RLIMIT_MSGQUEUE, 0)


def code_paths() -> list[Path]:
    """What a job may read: the interpreter, the installed packages, our source
    packages and the system libraries. Nothing else of the host."""
    import sys
    import sysconfig

    import worker

    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    paths |= {Path(p) for p in sysconfig.get_paths().values()}
    root = Path(worker.__file__).resolve().parent.parent
    for package in ("engine", "schemas", "worker", "torchport"):
        paths.add(root / package)
    paths |= {Path(p) for p in ("/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache")}
    paths.add(Path("/sys/devices/system/cpu"))
    resolved = {p.resolve() for p in paths if p.exists()}
    # The project root itself holds more than code (tests, data): bind only packages.
    resolved.discard(root)
    return sorted(resolved)
