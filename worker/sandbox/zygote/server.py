"""The zygote: a long-lived process that imported torch and the engine and ran one
tiny export, then forks one locked-down child per job. This module is its fork server:
start-up, the main loop, job children and reaping.

It is exec'd by the worker with a scrubbed environment (inside bubblewrap when
the host allows it) and talks to the worker over one control socket (fd given on
the command line). It never runs uploaded code and never starts torch's intra-op
thread pool (a forked child of a process that has would hang); it never touches
CUDA. When the control socket closes, it kills its children and exits.

Its other rooms: warmup.py (what it runs before forking), spares.py (pre-forked,
self-warmed children and the pages they learn), loader.py (round trips: the loader
children its jobs ask for), toolchain.py (the programs a target runs); they see the
zygote as zygote_job.py's `ZygoteHost` and its jobs as `Job`, so none imports this module.
The worker's end is zygote_client.py.

Messages (worker → zygote): `config`, `run` (with two fds: progress, output),
`kill`, `finish` (kill, and answer `finishing` at once), `quiet` (a job started a stage
on one core: fork the spares owed, spares.py). (zygote → worker): `hello`,
`started`, `finishing`, `exited`, `spares` (spares.py).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from array import array
from pathlib import Path
from typing import Any

from worker.sandbox import protocol
from worker.sandbox.child import run as child
from worker.sandbox.confinement import mountview
from worker.sandbox.confinement.gpu import GpuAccess
from worker.sandbox.confinement.lockdown import (
    Confinement,
    Limits,
    LockdownError,
    apply,
    prctl,
    set_dumpable,
)
from worker.sandbox.processes import (
    PR_SET_CHILD_SUBREAPER,
    close_fd,
    count_threads,
    kill_group,
    kill_strays,
    read_status_mb,
)
from worker.sandbox.zygote import pages
from worker.sandbox.zygote.job import Job
from worker.sandbox.zygote.loader import Loaders
from worker.sandbox.zygote.spares import Spares
from worker.sandbox.zygote.toolchain import Toolchains
from worker.sandbox.zygote.warmup import (
    WARM_PAYLOAD,
    WARM_PROGRAM,
    probe_bad_fork,
    warm_loader,
    warm_zygote,
)

__all__ = ["Job", "Zygote", "main"]


class Zygote:
    """The fork server."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.config: dict[str, Any] = {}
        self.jobs: dict[str, Job] = {}
        self.selector: selectors.BaseSelector = selectors.DefaultSelector()
        self.gpu: GpuAccess | None = None
        self.spares = Spares(self)
        self.loaders = Loaders(self)
        self.toolchains = Toolchains(self)
        self.data_mb = 0
        self.rss_mb = 0
        self.mount_view: list[str] = []
        """Directories covered by the zygote's private mount view (mountview.py)."""
        self.loader_warm = False

    # -- start-up ---------------------------------------------------------------------
    def start(self) -> None:
        message, _ = protocol.receive(self.ctl)
        if message is None or message.get("op") != "config":
            raise SystemExit(2)
        self.config = message
        if self.config.get("gpu"):
            self.gpu = GpuAccess.from_json(self.config["gpu"])
        started = time.perf_counter()
        self.mount_view = self._reachable_code()
        from worker.sandbox.confinement import seccomp

        seccomp.prepare()
        import encodings.idna  # noqa: F401  (socket name lookups import it lazily)
        import platform
        import tempfile  # noqa: F401  (the export path probes it lazily)

        platform.platform()  # caches `uname -p`, which it would otherwise run in each job

        torch, quieted, huge_mb, libraries = warm_zygote(self.config)
        self.spares.maps = pages.mappings() if pages.supported() else []
        cuda_initialized = bool(torch.cuda.is_initialized())
        cuda_poisoned = probe_bad_fork(torch)
        if self.gpu is not None and (cuda_initialized or cuda_poisoned):
            raise SystemExit(
                "the zygote touched CUDA during its warm-up "
                f"(initialized={cuda_initialized}, fork poisoned={cuda_poisoned}); "
                "its children could not use the GPU"
            )
        self.data_mb, self.rss_mb = read_status_mb("VmData"), read_status_mb("VmRSS")
        warm = Path(self.config["warm_dir"])
        self.spares.enabled = (
            bool(self.config.get("spares", True))
            and self.config.get("warm_up", True) is True
            and all(warm.joinpath(*p).is_file() for p in (WARM_PROGRAM, WARM_PAYLOAD))
        )
        protocol.send(
            self.ctl,
            {
                "op": "hello",
                "pid": os.getpid(),
                "threads": count_threads(),
                "quieted": quieted,
                "libraries": libraries.to_json(),
                "mount_view": self.mount_view,
                "data_mb": self.data_mb,
                "rss_mb": self.rss_mb,
                "spares": self.spares.enabled,
                "huge_mb": huge_mb,
                "prefault": bool(self.spares.maps),
                "warm_s": time.perf_counter() - started,
                "torch": torch.__version__,
                "cuda_initialized": cuda_initialized,
                "cuda_fork_poisoned": cuda_poisoned,
            },
        )

    def _reachable_code(self) -> list[str]:
        """Make the interpreter and packages readable by the job uid (mountview.py), then
        check that every `sys.path` entry is; refuse to start, naming them, otherwise."""
        uid, gid = self.config.get("uid"), self.config.get("gid")
        if uid is None or gid is None:
            return []  # jobs keep the worker's uid: they read what it reads
        covered: list[str] = []
        if self.config.get("mount_view"):
            code = [Path(p) for p in self.config["read_paths"]]
            code += [Path(p) for p in sys.path if p and os.path.isdir(p)]
            writable = [Path(self.config["jobs_root"])] if self.config.get("jobs_root") else []
            try:
                covered = mountview.build(code, writable, uid, gid)
            except OSError as exc:
                covered = [f"(failed: {exc})"]
        missing = mountview.unreadable(sys.path, uid, gid)
        if missing:
            raise SystemExit(
                f"jobs run as uid {uid} and could not import from {', '.join(missing)}: a "
                "directory on the way is private to its owner. Install bubblewrap (Debian "
                "package `bubblewrap`), or install Python and the packages where uid "
                f"{uid} can read them (e.g. /usr/local or /opt)"
                + (f"; a private mount view was tried: {covered[0]}" if covered else "")
            )
        return covered

    # -- main loop --------------------------------------------------------------------
    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.ctl, selectors.EVENT_READ, "ctl")
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        timeout = 1.0
        while True:
            for key, _ in self.selector.select(timeout=timeout):
                if key.data == "ctl":
                    if not self._on_control():
                        self._shutdown()
                        return
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                elif isinstance(key.data, tuple):
                    kind, name = key.data
                    if kind == "spare":
                        self.spares.on_message(name, key.fileobj)  # type: ignore[arg-type]
                        continue
                    job = self.jobs.get(name)
                    # An event of this batch may be stale: a request handled before it
                    # (a drop) closed that loader's pipe, and a new pipe may have its number.
                    if job is None:
                        continue
                    if kind == "request" and key.fd == job.request_fd:
                        self.loaders.on_request(job)
                    elif kind == "loader" and key.fd == job.loader_fd:
                        self.loaders.on_output(job)
            self._reap()
            due = self.spares.keep()
            timeout = 1.0 if due is None else min(1.0, due)

    def _on_control(self) -> bool:
        try:
            message, fds = protocol.receive(self.ctl)
        except (OSError, ValueError):
            return False
        if message is None:
            return False
        op = message.get("op")
        if op == "run" and len(fds) == 2:
            self._fork_job(message, fds[0], fds[1])
            if self.config.get("warm_up") == "during_first_job" and not self.loader_warm:
                self.loader_warm = True
                warm_loader(Path(self.config["warm_dir"]))
        elif op in ("kill", "finish"):
            job = self.jobs.get(str(message.get("id")))
            if job is not None:
                for pid in (job.pid, *job.helpers()):
                    kill_group(pid)
            if op == "finish":  # the job said done and its outputs are taken
                self._finishing(job, str(message.get("id")))
        elif op == "quiet":  # a job entered a stage that leaves a core free (spares.py)
            self.spares.fork_owed()
        for fd in fds:
            close_fd(fd)
        return True

    # -- job children -----------------------------------------------------------------
    def confinement(
        self,
        dirs: dict[str, str],
        limits: dict[str, int],
        writable: list[str],
        gpu: bool,
        exec_programs: bool = False,
    ) -> Confinement:
        """The lockdown of a child of a job (job child or loader): the job's directories
        and limits, its own uid and cgroups when the worker gave them, and with
        `exec_programs` (a toolchain child only, never a process that runs uploaded code)
        the programs its targets run, when Landlock can confine execution to them (never
        without Landlock)."""
        given = dict(limits)  # the job's own uid and gid travel with its limits
        uid, gid = (
            given.pop("uid", self.config.get("uid")),
            given.pop("gid", self.config.get("gid")),
        )
        groups: Any = given.pop("cgroups", None) or []  # paths among the ints
        programs: Any = given.pop("executables", None) or []  # paths among the ints
        given.pop("toolchain", None)  # the entry points (toolchain.py)
        landlock = bool(self.config.get("landlock", True))
        return Confinement(
            limits=Limits(**given),
            read_paths=[Path(p) for p in self.config["read_paths"]] + [Path(dirs["root"])],
            write_paths=[Path(p) for p in writable],
            scratch=Path(dirs["tmp"]),
            uid=uid,
            gid=gid,
            landlock=landlock,
            gpu=self.gpu if gpu else None,
            cgroups=[Path(group) for group in groups],
            executables=[Path(p) for p in programs] if exec_programs and landlock else [],
        )

    def _fork_job(self, message: dict[str, Any], progress_fd: int, output_fd: int) -> None:
        job_id = str(message["id"])
        dirs, limits = message["dirs"], message["limits"]
        req_r, req_w = os.pipe2(os.O_CLOEXEC)
        ans_r, ans_w = os.pipe2(os.O_CLOEXEC)
        gpu = bool(message.get("gpu")) and self.gpu is not None
        spare = None if gpu else self.spares.take("job")
        fds = [progress_fd, output_fd, req_w, ans_r]
        in_spare = spare is not None and self.spares.hand_over(
            spare, {"op": "job", "run": message}, fds
        )
        prefault = None
        if spare is not None and in_spare:
            pid = spare.pid
            extra_rss_mb = max(0, spare.rss_mb - self.rss_mb)
        else:
            extra_rss_mb = 0
            conf = self.job_confinement(dirs, limits, gpu, fds)
            prefault = None if gpu else self.spares.pages.get("job")
            pid = os.fork()
            if pid == 0:
                work = lambda: child.run_export_job(dirs["root"])  # noqa: E731
                self.become_child(conf, work, prefault=prefault)
        os.close(req_w)
        os.close(ans_r)
        job = Job(job_id, pid, os.dup(output_fd), req_r, ans_w, dirs, limits, gpu=gpu)
        self.jobs[job_id] = job
        self.selector.register(req_r, selectors.EVENT_READ, ("request", job_id))
        protocol.send(
            self.ctl,
            {
                "op": "started",
                "id": job_id,
                "pid": pid,
                "spare": in_spare,
                "prefault": prefault is not None,
                "extra_rss_mb": extra_rss_mb,
            },
        )

    def kill_strays(self) -> None:
        """Kill every child of the zygote that is none of its jobs, their helpers or its
        spares: what a helper of a job left behind when it exited (the zygote is their
        subreaper; processes.kill_strays)."""
        known = {spare.pid for spare in self.spares.children.values()}
        for job in self.jobs.values():
            known.update((job.pid, *job.helpers()))
        kill_strays(known)

    def announce_helper(self, job: Job, pid: int) -> None:
        """Tell the worker about a new process of `job` (a loader or a toolchain child):
        its memory and open files count against the job's limits (tree.py)."""
        protocol.send(self.ctl, {"op": "helper", "id": job.id, "pid": pid})

    def job_confinement(
        self, dirs: dict[str, str], limits: dict[str, int], gpu: bool, fds: list[int]
    ) -> Confinement:
        """A job child's confinement; `fds`: progress, output, round-trip request, answer."""
        progress, output, request, answer = fds
        conf = self.confinement(dirs, limits, [dirs["out"], dirs["tmp"]], gpu)
        conf.inert_mode_calls = bool(limits.get("toolchain"))
        conf.keep_fds = {1: output, 2: output, 3: progress, 4: request, 5: answer}
        return conf

    def detach(self) -> None:
        """In a fresh fork: let go of the zygote's selector, control socket and spares."""
        self.selector.close()
        self.ctl.close()
        signal.set_wakeup_fd(-1)
        self.spares.close_sockets()

    def become_child(
        self,
        conf: Confinement,
        work: Any,
        announce: bool = True,
        detached: bool = False,
        prefault: array | None = None,
    ) -> None:
        """In a fresh fork or a spare handed its work: lock down (refusing the work when
        that fails), say what is in force, run `work`, and exit; never returns."""
        code = 70
        try:
            if not detached:
                self.detach()
            if prefault is not None:  # a fresh fork: its warm-up's faults, in one go
                pages.prefault(prefault)
            try:
                in_force = apply(conf)
            except Exception as exc:  # fail closed: never run with less isolation
                why = str(exc) if isinstance(exc, LockdownError) else f"lockdown failed: {exc}"
                child.write_progress({"refused": "sandbox_violation", "message": why})
                os._exit(3)
            if announce:
                child.write_progress({"lockdown": in_force})
            code = int(work())
        except BaseException:
            try:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    # -- reaping ----------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.spares.reap(pid)
            for job in list(self.jobs.values()):
                if pid == job.loader_pid:
                    if job.loader_fd is not None:
                        self.loaders.drain(job)
                    self.loaders.finish(job, status)
                elif pid in job.old_loaders:
                    job.old_loaders.remove(pid)
                elif pid == job.toolchain_pid:
                    self.toolchains.finish(job, status)
                elif pid == job.pid:
                    self._finish_job(job, status)

    def _finish_job(self, job: Job, status: int) -> None:
        kill_group(job.pid)  # anything the job left in its group
        for helper in job.helpers():  # no process of the job outlives it
            kill_group(helper)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(helper, 0)
        del self.jobs[job.id]
        self.kill_strays()  # what its helpers left behind, reparented to the zygote
        for fd in (job.request_fd, job.loader_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(fd)
                close_fd(fd)
        close_fd(job.answer_fd)
        close_fd(job.output_fd)
        close_fd(job.loader_in)
        if job.loader_out is not None:  # a loader killed before it answered
            job.loader_out.clear()
        job.requests.clear()
        close_fd(job.toolchain_status)
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        protocol.send(
            self.ctl,
            {
                "op": "exited",
                "id": job.id,
                "code": code,
                "signal": signum,
                "killed_for": job.killed_for,
                "roundtrips": job.roundtrip_counts(),
            },
        )

    def _finishing(self, job: Job | None, job_id: str) -> None:
        """Answer `finish` at once, its processes killed (`exited` follows when they are
        reaped): what the worker still needs from the job, its round-trip counts."""
        message: dict[str, Any] = {"op": "finishing", "id": job_id}
        if job is not None:
            message["roundtrips"] = job.roundtrip_counts()
        protocol.send(self.ctl, message)

    def _shutdown(self) -> None:
        self.spares.drop_all()
        for job in self.jobs.values():
            for pid in (job.pid, *job.helpers()):
                kill_group(pid)
        for job in self.jobs.values():
            for pid in (job.pid, *job.helpers()):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python -I -c '...main()' CTL_FD`."""
    args = sys.argv[1:] if argv is None else argv
    set_dumpable(False)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctl = socket.socket(fileno=int(args[0]))
    zygote = Zygote(ctl)
    zygote.start()
    # What a job's helper leaves behind when it exits becomes the zygote's child, in
    # reach (kill_strays), not init's.
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    zygote.serve()
    # Its children are gone; tearing down torch's interpreter state would only make the
    # worker wait (~2 s at the end of every one-shot `torchport export`).
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)
