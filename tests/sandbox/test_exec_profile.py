"""The converters' lockdown profile: a job child may execute exactly the files it is given
(a deployment target's compiler and helpers), and nothing else changes: no other program,
no sockets, no writes outside its directories. Without them, no exec at all."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from worker.sandbox.confinement import landlock, seccomp
from worker.sandbox.confinement.lockdown import Confinement, Limits, apply, code_paths

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or landlock.abi_version() < 1, reason="needs root and Landlock"
)

TRUE = Path(shutil.which("true") or "/bin/true").resolve()
ID = Path(shutil.which("id") or "/usr/bin/id").resolve()
LOADER = next(
    p
    for p in (Path("/lib64/ld-linux-x86-64.so.2"), Path("/lib/ld-linux-aarch64.so.1"))
    if p.exists()
).resolve()


def _in_locked_child(tmp_path: Path, executables: list[Path]) -> dict[str, str]:
    """Fork, lock down as uid 65534 with `executables`, try things; what each gave."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(mode=0o777)
    os.chmod(scratch, 0o777)
    seccomp.prepare()  # as the zygote does: libseccomp is found before any lockdown
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        outcome: dict[str, str] = {}
        try:
            os.close(read_fd)
            os.dup2(write_fd, 3)
            apply(
                Confinement(
                    limits=Limits(memory_mb=2048, cpu_s=30, fsize_mb=16, nofile=64, nproc=4096),
                    read_paths=code_paths(),
                    write_paths=[scratch],
                    scratch=scratch,
                    uid=65534,
                    gid=65534,
                    keep_fds={3: 3},
                    executables=executables,
                )
            )
            for name, program in (("allowed", TRUE), ("other", ID)):
                try:
                    outcome[name] = str(subprocess.run([str(program)], check=False).returncode)
                except OSError as exc:
                    outcome[name] = type(exc).__name__
            outcome["clone_namespaces"] = _clone_namespaces()
            try:
                socket.socket()
                outcome["socket"] = "opened"
            except OSError as exc:
                outcome["socket"] = type(exc).__name__
            try:
                (tmp_path / "outside").write_text("x")
                outcome["write_outside"] = "written"
            except OSError as exc:
                outcome["write_outside"] = type(exc).__name__
        except BaseException as exc:
            outcome["error"] = repr(exc)
        finally:
            os.write(3, json.dumps(outcome).encode())
            os._exit(0)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 4096):
        data += chunk
    os.close(read_fd)
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def _clone_namespaces() -> str:
    """`clone` into new user, pid, net, mount and uts namespaces (a child there holds every
    capability in them): what it gave. Run in the locked-down child."""
    flags = sum(seccomp.CLONE_NAMESPACES.values()) - seccomp.CLONE_NAMESPACES["CLONE_NEWCGROUP"]
    libc = ctypes.CDLL(None, use_errno=True)
    pid = libc.syscall(56 if os.uname().machine == "x86_64" else 220, flags | 17, 0, 0, 0, 0)
    if pid == 0:  # pragma: no cover - a child that must not exist
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        return "cloned"
    return errno.errorcode[ctypes.get_errno()]


def test_given_files_run_and_nothing_else(tmp_path: Path) -> None:
    outcome = _in_locked_child(tmp_path, [TRUE, LOADER])
    assert outcome == {
        "allowed": "0",
        "other": "PermissionError",
        "clone_namespaces": "EPERM",  # processes may be made here, namespaces may not
        "socket": "PermissionError",
        "write_outside": "PermissionError",
    }


def test_without_executables_nothing_runs(tmp_path: Path) -> None:
    outcome = _in_locked_child(tmp_path, [])
    assert outcome["allowed"] == "PermissionError"
    assert outcome["other"] == "PermissionError"
    assert outcome["socket"] == "PermissionError"
    assert outcome["clone_namespaces"] == "EPERM"
