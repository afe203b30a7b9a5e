"""The toolchain broker: a deployment target's compiler and flatc, run for a job by the
zygote in a child of its own, never in the job's process.

The upload's code runs in the job child under the strict profile (no exec, no new
process) from its first line to its exit, whatever targets it asked for. When a
conversion needs a program (AOTInductor's `g++`, ExecuTorch's `flatc`), the job child
asks on its request pipe for a command by kind, naming only its files:
`TOOLCHAIN{"run": "gcc", "kind": "object", "inputs": [...], "output": ..., ...}`
(toolchain_commands.py). The zygote forks a toolchain child for it without parsing the
line (it names the job's files, and later jobs inherit the zygote's heap); the child
parses it after its lockdown and builds the command from the broker's templates
(`toolchain_commands.build`): the program is the job's `g++` or `flatc`, resolved by the
worker (`converters.toolchain`), every flag is the template's, and every file must be a
regular file in the job's directory. The toolchain child is locked down with the job's
confinement plus the converters' profile (Landlock may execute exactly the toolchain's
files; seccomp allows execve and process creation, never namespaces or a new session),
opens its output files in the job's scratch directory and execs the command with an
environment of ours. A refusal it answers itself; otherwise only the exit status comes
back through the zygote (`{"toolchain": true, "rc": N}`); the output is read by the job
from its own scratch directory, so nothing the compiler prints passes through memory
that later jobs inherit.

What a job gains by asking for these targets is therefore exactly this: the fixed
toolchain, with the templates' flags, on files of its own. No flag, plugin, wrapper,
program prefix, specs or response file, search path or environment variable of the
job's choosing reaches gcc, as, collect2 or ld, and `lto-wrapper` is not executable.
Every process the broker starts is in the job's tree (its cgroups, its session) and dies
with it (tree.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.sandbox import protocol
from worker.sandbox.processes import close_fd
from worker.sandbox.zygote.loader import answer
from worker.sandbox.zygote.relay import MAX_REQUEST
from worker.sandbox.zygote.toolchain_commands import Paths, Refused, build

if TYPE_CHECKING:
    from worker.sandbox.zygote.job import Job, ZygoteHost

__all__ = ["MAX_RUNS", "Toolchains", "output_paths"]

MAX_RUNS = 512
"""Toolchain runs per job (a small model's AOTI package takes ~8, a large one ~40)."""


def output_paths(scratch: Path, run: int) -> tuple[Path, Path]:
    """Where run number `run` of a job writes its standard output and error (in the
    job's scratch directory, its $TMPDIR, where `requests.BrokeredPopen` reads them)."""
    folder = scratch / ".toolchain"
    return folder / f"{run}.out", folder / f"{run}.err"


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
        if job.toolchain_pid is not None and not self._refused(job):
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
        found: dict[str, Any] = job.limits.get("toolchain") or {}  # type: ignore[assignment]
        root = Path(job.dirs["root"])
        try:
            pid = os.fork()
        except OSError:
            close_fd(status_r)
            close_fd(status_w)
            answer(job, _REFUSED_FORK)
            return
        if pid == 0:
            work = lambda: _serve(line, found, root, out, err)  # noqa: E731
            self.zygote.become_child(conf, work, announce=False)
        close_fd(status_w)
        job.toolchain_pid, job.toolchain_status = pid, status_r
        self.zygote.announce_helper(job, pid)

    def _refused(self, job: Job) -> bool:
        """Whether the job's running toolchain child answered a refusal and is exiting: a
        job that has its answer may ask again before the zygote reaped that child. It is
        reaped now (it exits right after answering)."""
        assert job.toolchain_pid is not None and job.toolchain_status is not None
        os.set_blocking(job.toolchain_status, False)
        try:
            said = os.read(job.toolchain_status, 1)
        except OSError:  # nothing yet: still checking, or running the program
            return False
        if said != b"R":  # closed by the exec: the program runs
            return False
        try:
            _, status = os.waitpid(job.toolchain_pid, 0)
        except ChildProcessError:
            status = 0
        self.finish(job, status, refused=True)
        return True

    def finish(self, job: Job, status: int, *, refused: bool = False) -> None:
        """The toolchain child exited: unless it answered a refusal itself, its status is
        the job's answer."""
        if job.toolchain_status is not None:
            os.set_blocking(job.toolchain_status, False)
            with contextlib.suppress(OSError):
                refused = refused or os.read(job.toolchain_status, 1) == b"R"
            close_fd(job.toolchain_status)
        job.toolchain_pid = job.toolchain_status = None
        self.zygote.kill_strays()  # nothing the program started outlives it
        if refused:
            return
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        answer(job, {"toolchain": True, "rc": rc, "run": job.toolchain_runs})


_REFUSED_BUSY = {"toolchain": True, "rc": None, "refused": "a toolchain program is running"}
_REFUSED_RUNS = {"toolchain": True, "rc": None, "refused": f"more than {MAX_RUNS} runs"}
_REFUSED_FORK = {"toolchain": True, "rc": None, "refused": "no process could be started"}


def _serve(line: memoryview, found: dict[str, Any], root: Path, out: Path, err: Path) -> int:
    """In the locked-down toolchain child: parse and check the request, build its command
    from the templates, then exec it (fd 3: the status pipe to the zygote; fd 4: the
    job's answer pipe)."""
    try:
        request = protocol.loads_untrusted(bytes(line), MAX_REQUEST)
        program, argv, cwd, merge = build(request, Paths.from_limits(found), root)
    except (ValueError, Refused) as exc:
        reply = {"toolchain": True, "rc": None, "refused": str(exc)[:1000]}
        with contextlib.suppress(OSError):  # "R" first: the job asks again once answered
            os.write(3, b"R")
            os.write(4, (json.dumps(reply) + "\n").encode())
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
