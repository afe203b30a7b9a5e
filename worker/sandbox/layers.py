"""Which isolation layers this host supports, probed once at start-up.

The probes try the real thing (a Landlock ruleset, a seccomp filter in a
throw-away process, a bubblewrap sandbox running `python -c pass`) rather than
reading version numbers, because containers often forbid what the kernel has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from worker.sandbox import landlock


@dataclass(frozen=True)
class HostLayers:
    """What the host supports."""

    landlock_abi: int
    seccomp: bool
    bwrap: str | None
    """Path of a working `bwrap`, or None."""
    root: bool
    notes: dict[str, str] = field(default_factory=dict)


def probe_seccomp() -> tuple[bool, str]:
    """Whether a seccomp filter can be loaded here (tried in a forked child)."""
    try:
        from worker.sandbox import seccomp

        seccomp.prepare()
    except Exception as exc:  # ImportError, missing libseccomp
        return False, f"pyseccomp unusable: {type(exc).__name__}: {exc}"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            import pyseccomp

            from worker.sandbox.lockdown import PR_SET_NO_NEW_PRIVS, prctl

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


def probe_bwrap(binds: list[Path], python: str) -> tuple[str | None, str]:
    """A working bwrap binary, tried with all namespaces and the binds the zygote uses."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None, "bwrap not installed (Debian package `bubblewrap`)"
    from worker.sandbox import bubblewrap

    argv = bubblewrap.command(exe, binds, jobs_root=None, tmpfs_mb=8)
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


def probe(binds: list[Path], python: str = sys.executable, try_bwrap: bool = True) -> HostLayers:
    """Probe every layer."""
    notes: dict[str, str] = {}
    abi = landlock.abi_version()
    if abi == 0:
        notes["landlock"] = "the kernel has no Landlock (or it is disabled)"
    seccomp_ok, why = probe_seccomp()
    if why:
        notes["seccomp"] = why
    bwrap = None
    if try_bwrap:
        bwrap, why = probe_bwrap(binds, python)
        if why:
            notes["bwrap"] = why
    return HostLayers(
        landlock_abi=abi, seccomp=seccomp_ok, bwrap=bwrap, root=os.geteuid() == 0, notes=notes
    )
