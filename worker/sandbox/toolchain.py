"""The toolchain broker: a deployment target's compiler and flatc, run for a job by the
zygote in a child of its own, never in the job's process.

The upload's code runs in the job child under the strict profile (no exec, no new
process) from its first line to its exit, whatever targets it asked for. When a
conversion needs a program (AOTInductor's `g++`, ExecuTorch's `flatc`), the job child
asks on its request pipe: `TOOLCHAIN{"exec": argv, "cwd": dir, "merge": bool}`. The
zygote forks a toolchain child for it without parsing the line (it names the job's files
and flags, and later jobs inherit the zygote's heap); the child checks it (`check`) after
its lockdown: the program must be one of the job's entry points
(`converters.entry_points`, resolved by the worker), every flag must be one this
module allows for it, and every file it names must lie in the job's directory. The
toolchain child is locked down with the job's confinement plus the converters' profile
(Landlock may execute exactly the toolchain's files; seccomp allows execve and process
creation, never namespaces), opens its output files in the job's scratch directory and
execs the program with an environment of ours. A refusal it answers itself; otherwise
only the exit status comes back through the zygote (`{"toolchain": true, "rc": N}`); the
output is read by the job from its own scratch directory, so nothing the compiler prints
passes through memory that later jobs inherit.

What a job gains by asking for these targets is therefore exactly this: the fixed
toolchain, with flags from the list below, on files of its own. No plugin
(`-fplugin`), wrapper (`-wrapper`), program prefix (`-B`), specs file, response file
(`@file`), linker plugin or LTO (which runs `lto-wrapper` with options read from object
files): none of them is on the list, and `lto-wrapper` is not executable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.sandbox import protocol
from worker.sandbox.loader import answer
from worker.sandbox.processes import close_fd
from worker.sandbox.relay import MAX_REQUEST

if TYPE_CHECKING:
    from worker.sandbox.zygote_job import Job, ZygoteHost

__all__ = ["MAX_RUNS", "Refused", "Toolchains", "check", "output_paths"]

MAX_RUNS = 512
"""Toolchain runs per job (a small model's AOTI package takes ~8, a large one ~40)."""

MAX_ARGS = 512
MAX_ARG_CHARS = 4096

_GCC_PLAIN = {
    "--version",
    "-v",
    "-dumpversion",
    "-dumpfullversion",
    "-c",
    "-E",
    "-P",
    "-S",
    "-shared",
    "-pedantic",
    "-pthread",
    "-fPIC",
    "-fpic",
    "-g",
    "-s",
    "-w",
}
_GCC_PATTERNS = [
    re.compile(p)
    for p in (
        r"-D[A-Za-z_][A-Za-z0-9_]*(=.*)?",
        r"-U[A-Za-z_][A-Za-z0-9_]*",
        r"-O[0-3sgz]?|-Ofast",
        r"-g[0-3]",
        r"-std=[a-z0-9+]+",
        r"-march=[A-Za-z0-9_.+-]+",
        r"-mtune=[A-Za-z0-9_.+-]+",
        r"-m(no-)?[a-z0-9][a-z0-9-]*",
        r"-W(no-)?[a-z][a-z0-9+=-]*",
        r"-f(no-)?[a-z][a-z0-9-]*(=[A-Za-z0-9_.,-]+)?",
        r"-l[A-Za-z0-9_.+-]+",
    )
]
_GCC_DENIED_F = ("-fplugin", "-fno-plugin", "-fuse-ld", "-flto", "-fuse-linker-plugin")
_GCC_WITH_PATH = {"-I", "-L", "-isystem"}
"""Flags that take a directory (anywhere: Landlock decides what can be read)."""
_GCC_LANGUAGES = {"c", "c++", "assembler", "assembler-with-cpp", "none"}

_FLATC_PLAIN = {"--binary", "--json", "--strict-json", "--defaults-json", "--raw-binary", "--"}


class Refused(ValueError):
    """A toolchain request the broker does not run (the reason is the message)."""


def check(
    request: dict[str, Any], entry_points: dict[str, str], root: Path
) -> tuple[str, list[str], str, bool]:
    """The program, argv, working directory and output merging of a job's request, or
    `Refused`. `entry_points` maps command names to the files the worker resolved;
    `root` is the job's staging directory, where every file argument must lie."""
    argv, cwd, merge = request.get("exec"), request.get("cwd"), request.get("merge", False)
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGS:
        raise Refused("exec must be a non-empty list of arguments")
    if not all(isinstance(arg, str) and 0 < len(arg) <= MAX_ARG_CHARS for arg in argv):
        raise Refused("every argument must be a non-empty string")
    if any("\x00" in arg for arg in argv):
        raise Refused("an argument holds a NUL byte")
    program = _entry_point(argv[0], entry_points)
    name = "flatc" if program == entry_points.get("flatc") else "g++"
    if name == "g++":
        _check_gcc(argv[1:], root)
    else:
        _check_flatc(argv[1:], root)
    workdir = _inside(cwd, root, "cwd") if cwd is not None else str(root)
    return program, [program, *argv[1:]], workdir, bool(merge)


def output_paths(scratch: Path, run: int) -> tuple[Path, Path]:
    """Where run number `run` of a job writes its standard output and error (in the
    job's scratch directory, its $TMPDIR, where `requests.BrokeredPopen` reads them)."""
    folder = scratch / ".toolchain"
    return folder / f"{run}.out", folder / f"{run}.err"


def _entry_point(command: str, entry_points: dict[str, str]) -> str:
    if command.startswith("/") and os.path.realpath(command) in entry_points.values():
        return os.path.realpath(command)
    base = command.rsplit("/", 1)[-1]
    if "/" not in command and base in entry_points:
        return entry_points[base]
    allowed = ", ".join(sorted(entry_points)) or "none for this job's targets"
    raise Refused(f"{command!r} is not a program of this job's targets ({allowed})")


def _check_gcc(args: list[str], root: Path) -> None:
    def language(value: str) -> None:
        if value not in _GCC_LANGUAGES:
            raise Refused(f"-x {value!r} is not an allowed language")

    def macro(value: str) -> None:
        if not _GCC_PATTERNS[0].fullmatch("-D" + value):
            raise Refused(f"{value!r} is not a macro definition")

    def other(arg: str) -> bool:
        if arg[:2] in ("-I", "-L") and len(arg) > 2:
            _absolute(arg[2:], arg[:2])
            return True
        if arg.startswith(_GCC_DENIED_F):
            raise Refused(f"{arg!r} is not allowed (it loads or runs other programs)")
        return any(pattern.fullmatch(arg) for pattern in _GCC_PATTERNS)

    valued: dict[str, Callable[[str], object]] = {
        "-o": lambda value: _inside(value, root, "-o"),
        "-x": language,
        "-D": macro,
        "-U": macro,
    }
    valued.update({flag: lambda value: _absolute(value, "a directory") for flag in _GCC_WITH_PATH})
    _walk(args, root, _GCC_PLAIN, valued, other, "compiler")


def _check_flatc(args: list[str], root: Path) -> None:
    valued: dict[str, Callable[[str], object]] = {"-o": lambda value: _inside(value, root, "-o")}
    _walk(args, root, _FLATC_PLAIN, valued, lambda arg: False, "flatc")


def _walk(
    args: list[str],
    root: Path,
    plain: set[str],
    valued: dict[str, Callable[[str], object]],
    other: Callable[[str], bool],
    what: str,
) -> None:
    """Check each argument: a flag of its own (`plain`), a flag and its value (`valued`
    checks the value), another allowed flag (`other`), or a file in the job's directory."""
    position = 0
    while position < len(args):
        arg = args[position]
        position += 1
        if arg in plain:
            continue
        if arg in valued:
            if position >= len(args):
                raise Refused(f"{arg} needs a value")
            valued[arg](args[position])
            position += 1
            continue
        if other(arg):
            continue
        if arg.startswith(("-", "@")):
            raise Refused(f"{arg!r} is not an allowed {what} flag")
        _inside(arg, root, "input file")


def _absolute(value: str, what: str) -> None:
    if not value.startswith("/"):
        raise Refused(f"{what} {value!r} must be an absolute path")


def _inside(value: Any, root: Path, what: str) -> str:
    """`value` as a path that lies in `root` (symbolic links resolved)."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise Refused(f"{what} {value!r} must be an absolute path in the job's directory")
    resolved = Path(os.path.realpath(value))
    if resolved != root and root not in resolved.parents:
        raise Refused(f"{what} {value!r} is outside the job's directory")
    return value


class Toolchains:
    """The zygote's side of its jobs' toolchain requests (the state is each `Job`'s).

    The request line stays bytes in the zygote (`relay.Requests`, zeroed once handled):
    it names the job's files and flags, and every later job inherits the zygote's heap.
    The toolchain child parses and checks it after its lockdown, in its own address
    space; a refusal it answers itself, and says so on its status pipe ("R"); a program
    it runs closes that pipe as it is exec'd, and its exit status is the answer."""

    def __init__(self, zygote: ZygoteHost) -> None:
        self.zygote = zygote

    def on_request(self, job: Job, line: memoryview) -> None:
        """Hand a toolchain request (its JSON, as bytes) to a toolchain child, or refuse
        it at once when one is running or the job had its runs."""
        if job.toolchain_pid is not None:
            answer(job, _REFUSED_BUSY)
            return
        if job.toolchain_runs >= MAX_RUNS:
            answer(job, _REFUSED_RUNS)
            return
        job.toolchain_runs += 1
        out, err = output_paths(Path(job.dirs["tmp"]), job.toolchain_runs)
        conf = self.zygote.confinement(
            job.dirs, job.limits, [job.dirs["out"], job.dirs["tmp"]], job.gpu, exec_programs=True
        )
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        conf.keep_fds = {3: status_w, 4: job.answer_fd}
        entry_points: dict[str, str] = job.limits.get("toolchain") or {}  # type: ignore[assignment]
        root = Path(job.dirs["root"])
        try:
            pid = os.fork()
        except OSError:
            close_fd(status_r)
            close_fd(status_w)
            answer(job, _REFUSED_FORK)
            return
        if pid == 0:
            work = lambda: _serve(line, entry_points, root, out, err)  # noqa: E731
            self.zygote.become_child(conf, work, announce=False)
        close_fd(status_w)
        job.toolchain_pid, job.toolchain_status = pid, status_r
        self.zygote.announce_helper(job, pid)

    def finish(self, job: Job, status: int) -> None:
        """The toolchain child exited: unless it answered a refusal itself, its status is
        the job's answer."""
        refused = b""
        if job.toolchain_status is not None:
            os.set_blocking(job.toolchain_status, False)
            with contextlib.suppress(OSError):
                refused = os.read(job.toolchain_status, 1)
            close_fd(job.toolchain_status)
        job.toolchain_pid = job.toolchain_status = None
        if refused:
            return
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        answer(job, {"toolchain": True, "rc": rc, "run": job.toolchain_runs})


_REFUSED_BUSY = {"toolchain": True, "rc": None, "refused": "a toolchain program is running"}
_REFUSED_RUNS = {"toolchain": True, "rc": None, "refused": f"more than {MAX_RUNS} runs"}
_REFUSED_FORK = {"toolchain": True, "rc": None, "refused": "no process could be started"}


def _serve(line: memoryview, entry_points: dict[str, str], root: Path, out: Path, err: Path) -> int:
    """In the locked-down toolchain child: parse and check the request, then exec its
    program (fd 3: the status pipe to the zygote; fd 4: the job's answer pipe)."""
    try:
        request = protocol.loads_untrusted(bytes(line), MAX_REQUEST)
        program, argv, cwd, merge = check(request, entry_points, root)
    except (ValueError, Refused) as exc:
        reply = {"toolchain": True, "rc": None, "refused": str(exc)[:1000]}
        with contextlib.suppress(OSError):
            os.write(4, (json.dumps(reply) + "\n").encode())
            os.write(3, b"R")
        return 0
    os.set_inheritable(3, False)  # closed by the exec: the zygote then answers the rc
    os.set_inheritable(4, False)
    return _exec(program, argv, cwd, out, None if merge else err)


def _exec(program: str, argv: list[str], cwd: str, out: Path, err: Path | None) -> int:
    """In the locked-down toolchain child: output to the job's scratch, then exec."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        out.parent.mkdir(mode=0o700, exist_ok=True)
        for path in (out, err):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        out_fd = os.open(out, flags, 0o600)
        err_fd = os.open(err, flags, 0o600) if err is not None else out_fd
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.chdir(cwd)
        tmp = str(out.parent.parent)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": tmp}
        env["HOME"] = tmp
        os.execve(program, argv, env)
    except OSError as exc:
        os.write(2, f"torchport toolchain: {exc}\n".encode())
    return 127
