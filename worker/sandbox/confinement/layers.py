"""Which isolation layers this host supports, probed once at start-up.

The probes try the real thing (a Landlock ruleset, a seccomp filter in a
throw-away process, a bubblewrap sandbox running `python -c pass`) rather than
reading version numbers, because containers often forbid what the kernel has.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from worker.sandbox.confinement import landlock
from worker.sandbox.confinement.gpu import GpuAccess


@dataclass(frozen=True)
class HostLayers:
    """What the host supports."""

    landlock_abi: int
    seccomp: bool
    bwrap: str | None
    """Path of a working `bwrap`, or None."""
    root: bool
    notes: dict[str, str] = field(default_factory=dict)
    gvisor: bool = False
    """Running under gVisor (whose kernel has no Landlock: the job runs without it)."""


def probe_seccomp() -> tuple[bool, str]:
    """Whether a seccomp filter can be loaded here (tried in a forked child)."""
    try:
        from worker.sandbox.confinement import seccomp

        seccomp.prepare()
    except Exception as exc:  # ImportError, missing libseccomp
        return False, f"pyseccomp unusable: {type(exc).__name__}: {exc}"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            import pyseccomp

            from worker.sandbox.confinement.lockdown import PR_SET_NO_NEW_PRIVS, prctl

            prctl(PR_SET_NO_NEW_PRIVS, 1)
            flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
            flt.add_rule(pyseccomp.ERRNO(1), "uname")
            flt.load()
            try:
                os.uname()
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    ok = os.waitstatus_to_exitcode(status) == 0
    return ok, "" if ok else "the kernel refused a seccomp filter"


def probe_bwrap(
    binds: list[Path], python: str, gpu: GpuAccess | None = None
) -> tuple[str | None, str]:
    """A working bwrap binary, tried with all namespaces and the binds the zygote uses."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None, "bwrap not installed (Debian package `bubblewrap`)"
    from worker.sandbox.confinement import bubblewrap

    argv = bubblewrap.command(exe, binds, jobs_root=None, tmpfs_mb=8, gpu=gpu)
    try:
        done = subprocess.run(
            [*argv, python, "-I", "-c", "pass"],
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap failed: {exc}"
    if done.returncode != 0:
        return None, "bwrap failed: " + done.stderr.decode(errors="replace")[-300:]
    return exe, ""


GVISOR_UNAME_VERSION = "#1 SMP Sun Jan 10 15:06:54 PST 2016"
"""The kernel build string gVisor's Sentry reports for every release it emulates."""
LANDLOCK_GVISOR = "unavailable (gvisor)"

_SYSLOG_ACTION_READ_ALL = 3


def detect_gvisor(uname: os.uname_result | None = None, kernel_log: str | None = None) -> bool:
    """Whether this process runs on gVisor's Sentry rather than a Linux kernel.

    Two markers must agree: gVisor's fixed `uname -v` build string, and either its
    kernel release (`4.4.0`, or one naming gvisor) or its boot messages in the kernel
    log ("Starting gVisor..."). A real kernel matches neither by accident; `uname` and
    `kernel_log` are parameters for tests.
    """
    info = uname if uname is not None else os.uname()
    if info.version != GVISOR_UNAME_VERSION:
        return False
    if info.release == "4.4.0" or "gvisor" in info.release.lower():
        return True
    log = _kernel_log() if kernel_log is None else kernel_log
    return "gVisor" in log


def _kernel_log() -> str:
    """The kernel ring buffer (`dmesg`), or "" where it may not be read."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(1 << 16)
    size = libc.klogctl(_SYSLOG_ACTION_READ_ALL, buf, len(buf))
    return buf.raw[: max(size, 0)].decode(errors="replace")


def probe(
    binds: list[Path],
    python: str = sys.executable,
    try_bwrap: bool = True,
    gpu: GpuAccess | None = None,
) -> HostLayers:
    """Probe every layer (bwrap with a GPU worker's binds when `gpu` is given)."""
    notes: dict[str, str] = {}
    abi, err = landlock.probe()
    gvisor = detect_gvisor()
    if abi == 0:
        if gvisor and err == errno.ENOSYS:
            notes["landlock"] = LANDLOCK_GVISOR
        else:
            why = os.strerror(err) if err else "no ABI"
            notes["landlock"] = f"unavailable (the kernel has no Landlock: {why})"
    seccomp_ok, why = probe_seccomp()
    if why:
        notes["seccomp"] = why
    bwrap = None
    if try_bwrap:
        bwrap, why = probe_bwrap(binds, python, gpu)
        if why:
            notes["bwrap"] = why
    return HostLayers(
        landlock_abi=abi,
        seccomp=seccomp_ok,
        bwrap=bwrap,
        root=os.geteuid() == 0,
        notes=notes,
        gvisor=gvisor,
    )
