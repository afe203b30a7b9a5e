"""The zygote: a long-lived process that imported torch and the engine and ran one
tiny export, then forks one locked-down child per job.

It is exec'd by the worker with a scrubbed environment (inside bubblewrap when
the host allows it) and talks to the worker over one control socket (fd given on
the command line). It never runs uploaded code and never starts torch's intra-op
thread pool (a forked child of a process that has would hang); it never touches
CUDA. When the control socket closes, it kills its children and exits.

Spares: while no job runs, the zygote keeps one forked *spare* job child and one
spare loader child. The first spare of each kind runs the zygote's own warm-up once
more in its own address space (so the copy-on-write faults and cold caches of a fresh
fork are paid while the worker is idle) and learns from its page map which pages that
touched (pages.py); later spares, and fresh forks when no spare is ready, fault those
pages in with madvise instead (~50 ms against ~750 ms). A spare then says `ready` and
waits on a private socket. The next CPU job (or round trip) is handed to the ready
spare, which only then locks itself down exactly as a freshly forked child would and
runs it. Work that finds no spare ready gets a fresh fork; a spare still running the
slow warm-up is killed then (it would compete with the job for the CPU), one faulting
in learned pages is left to finish. GPU jobs always get a fresh fork, never
prefaulted.

Messages (worker → zygote): `config`, `run` (with two fds: progress, output),
`kill`. (zygote → worker): `hello`, `started`, `exited`.
(zygote → spare): `job` (fds: progress, output, round-trip request and answer),
`load` (fds: output, answer, payload path in). (spare → zygote): `ready` (with the
name of its learned-pages file in the warm-up directory, the first of a kind), then
(zygote → worker) `spares` with the kinds now ready and the pages learned per kind.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import sys
import time
import traceback
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.sandbox import child, pages, protocol
from worker.sandbox.gpu import GpuAccess
from worker.sandbox.lockdown import (
    PR_SET_PDEATHSIG,
    Confinement,
    Limits,
    LockdownError,
    apply,
    prctl,
    set_dumpable,
)

MAX_ROUNDTRIPS = 4
MAX_REQUEST = 1 << 14
MAX_SPARE_FAILURES = 3
"""Spares that die before they are ready, in a row, before the zygote stops making them."""
WARM_PROGRAM = ("out", "program.pt2")
WARM_PAYLOAD = ("work", "roundtrip-payload.pt")


@dataclass
class _Job:
    id: str
    pid: int
    output_fd: int
    request_fd: int
    answer_fd: int
    dirs: dict[str, str]
    limits: dict[str, int]
    buffer: bytes = b""
    roundtrips: int = 0
    loader_spares: int = 0
    loader_pid: int | None = None
    loader_fd: int | None = None
    loader_in: int | None = None
    loader_out: bytes = b""
    loader_started: float = 0.0
    old_loaders: list[int] = field(default_factory=list)
    """Loaders that answered and were killed, not yet reaped."""
    closed: list[int] = field(default_factory=list)
    gpu: bool = False


@dataclass
class _Spare:
    """A forked child that warmed itself up and waits for one job or one round trip."""

    kind: str
    pid: int
    sock: socket.socket
    ready: bool = False
    rss_mb: int = 0
    """Its resident size when it said ready (the worker's RSS limit allows for the rest)."""


class Zygote:
    """The fork server."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.config: dict[str, Any] = {}
        self.jobs: dict[str, _Job] = {}
        self.selector = selectors.DefaultSelector()
        self.gpu: GpuAccess | None = None
        self.spares: dict[str, _Spare] = {}
        self.spares_enabled = False
        self.spare_failures = 0
        self.maps: list[pages.Mapping] = []
        """The zygote's mappings once warm: what learned page ranges refer to."""
        self.pages: dict[str, array] = {}
        """Per spare kind, the page ranges its warm-up touched (pages.py), once learned."""
        self.learned: dict[str, dict[str, int]] = {}
        """Per spare kind, how many pages those ranges hold (told to the worker)."""
        self.data_mb = 0
        self.rss_mb = 0

    # -- start-up ---------------------------------------------------------------------
    def start(self) -> None:
        message, _ = protocol.receive(self.ctl)
        if message is None or message.get("op") != "config":
            raise SystemExit(2)
        self.config = message
        if self.config.get("gpu"):
            self.gpu = GpuAccess.from_json(self.config["gpu"])
        started = time.perf_counter()
        from worker.sandbox import seccomp

        seccomp.prepare()
        import encodings.idna  # noqa: F401  (socket name lookups import it lazily)
        import platform
        import tempfile  # noqa: F401  (the export path probes it lazily)

        platform.platform()  # caches `uname -p`, which it would otherwise run in each job

        import torch

        # A forked child of a process whose intra-op pool ever ran hangs forever. With one
        # thread, parallel_for runs inline and the pool is never started; each child sets
        # its own thread count (child.run_export_job) and starts a fresh pool if it needs one.
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        threads_before = _thread_count()
        with cuda_hidden(torch):
            import torchport  # noqa: F401  (reads its version from installed metadata once)
            from engine import environment, pipeline, roundtrip  # noqa: F401

            environment.describe("cpu")

            if self.config.get("warm_up", True):
                warm = Path(self.config["warm_dir"])
                pipeline.warm_up(warm)
                _warm_full_pipeline(warm)
        if _thread_count() > threads_before:
            raise SystemExit("the warm-up started threads; forked children would hang")
        # Everything alive now is shared with every child. Freezing it keeps the
        # children's collector from walking (and so copying on write) the whole heap.
        gc.collect()
        gc.freeze()
        huge_mb = collapse_heap()
        self.maps = pages.mappings() if pages.supported() else []
        cuda_initialized = bool(torch.cuda.is_initialized())
        cuda_poisoned = _children_in_bad_fork(torch)
        if self.gpu is not None and (cuda_initialized or cuda_poisoned):
            raise SystemExit(
                "the zygote touched CUDA during its warm-up "
                f"(initialized={cuda_initialized}, fork poisoned={cuda_poisoned}); "
                "its children could not use the GPU"
            )
        self.data_mb, self.rss_mb = _status_mb("VmData"), _status_mb("VmRSS")
        warm = Path(self.config["warm_dir"])
        self.spares_enabled = (
            bool(self.config.get("spares", True))
            and bool(self.config.get("warm_up", True))
            and all(warm.joinpath(*p).is_file() for p in (WARM_PROGRAM, WARM_PAYLOAD))
        )
        protocol.send(
            self.ctl,
            {
                "op": "hello",
                "pid": os.getpid(),
                "threads": _thread_count(),
                "data_mb": self.data_mb,
                "rss_mb": self.rss_mb,
                "spares": self.spares_enabled,
                "huge_mb": huge_mb,
                "prefault": bool(self.maps),
                "warm_s": time.perf_counter() - started,
                "torch": torch.__version__,
                "cuda_initialized": cuda_initialized,
                "cuda_fork_poisoned": cuda_poisoned,
            },
        )

    # -- main loop --------------------------------------------------------------------
    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.ctl, selectors.EVENT_READ, "ctl")
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in self.selector.select(timeout=1.0):
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
                        self._on_spare(name)
                        continue
                    job = self.jobs.get(name)
                    if job is not None:
                        if kind == "request":
                            self._on_request(job)
                        else:
                            self._on_loader_output(job)
            self._reap()
            self._keep_spares()

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
        elif op == "kill":
            job = self.jobs.get(str(message.get("id")))
            if job is not None:
                _kill_group(job.pid)
                if job.loader_pid:
                    _kill_group(job.loader_pid)
        for fd in fds:
            _close(fd)
        return True

    # -- job children -----------------------------------------------------------------
    def _confinement(
        self, dirs: dict[str, str], limits: dict[str, int], writable: list[str], gpu: bool
    ) -> Confinement:
        return Confinement(
            limits=Limits(**limits),
            read_paths=[Path(p) for p in self.config["read_paths"]] + [Path(dirs["root"])],
            write_paths=[Path(p) for p in writable],
            scratch=Path(dirs["tmp"]),
            uid=self.config.get("uid"),
            gid=self.config.get("gid"),
            landlock=bool(self.config.get("landlock", True)),
            gpu=self.gpu if gpu else None,
        )

    def _fork_job(self, message: dict[str, Any], progress_fd: int, output_fd: int) -> None:
        job_id = str(message["id"])
        dirs, limits = message["dirs"], message["limits"]
        req_r, req_w = os.pipe2(os.O_CLOEXEC)
        ans_r, ans_w = os.pipe2(os.O_CLOEXEC)
        gpu = bool(message.get("gpu")) and self.gpu is not None
        spare = None if gpu else self._take_spare("job")
        fds = [progress_fd, output_fd, req_w, ans_r]
        in_spare = spare is not None and self._hand_over(spare, {"op": "job", "run": message}, fds)
        prefault = None
        if spare is not None and in_spare:
            pid = spare.pid
            extra_rss_mb = max(0, spare.rss_mb - self.rss_mb)
        else:
            extra_rss_mb = 0
            conf = self._job_confinement(dirs, limits, gpu, fds)
            prefault = None if gpu else self.pages.get("job")
            pid = os.fork()
            if pid == 0:
                work = lambda: child.run_export_job(message["spec"])  # noqa: E731
                self._become_child(conf, work, prefault=prefault)
        os.close(req_w)
        os.close(ans_r)
        job = _Job(job_id, pid, os.dup(output_fd), req_r, ans_w, dirs, limits, gpu=gpu)
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

    def _job_confinement(
        self, dirs: dict[str, str], limits: dict[str, int], gpu: bool, fds: list[int]
    ) -> Confinement:
        """A job child's confinement; `fds`: progress, output, round-trip request, answer."""
        progress, output, request, answer = fds
        conf = self._confinement(dirs, limits, [dirs["out"], dirs["tmp"]], gpu)
        conf.keep_fds = {1: output, 2: output, 3: progress, 4: request, 5: answer}
        return conf

    def _detach(self) -> None:
        """In a fresh fork: let go of the zygote's selector, control socket and spares."""
        self.selector.close()
        self.ctl.close()
        signal.set_wakeup_fd(-1)
        for spare in self.spares.values():
            spare.sock.close()

    def _become_child(
        self,
        conf: Confinement,
        work: Any,
        announce: bool = True,
        detached: bool = False,
        prefault: array | None = None,
    ) -> None:
        code = 70
        try:
            if not detached:
                self._detach()
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

    def _on_request(self, job: _Job) -> None:
        try:
            data = os.read(job.request_fd, 4096)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(job.request_fd)
            _close(job.request_fd)
            job.request_fd = -1
            return
        job.buffer += data
        if len(job.buffer) > MAX_REQUEST:
            _kill_group(job.pid)
            return
        while b"\n" in job.buffer:
            line, job.buffer = job.buffer.split(b"\n", 1)
            self._on_request_line(job, line)

    def _on_request_line(self, job: _Job, line: bytes) -> None:
        """`{"pt2", "threads"}` starts a loader on that program; `{"payload"}` hands the
        running loader its payload (both in one line: both). Anything else: a failed
        answer. The job is untrusted: its paths reach only a locked-down loader."""
        try:
            request = json.loads(line)
            pt2 = request.get("pt2")
            payload = request.get("payload")
            if pt2 is None and payload is None:
                raise ValueError("neither pt2 nor payload")
            cpus = len(os.sched_getaffinity(0))
            threads = max(1, min(int(request.get("threads") or cpus), cpus))
        except (ValueError, TypeError, AttributeError):
            self._answer(job, {"status": "failed", "reason": "malformed round-trip request"})
            return
        if pt2 is not None:
            if job.loader_pid is not None or job.roundtrips >= MAX_ROUNDTRIPS:
                self._answer(job, {"status": "failed", "reason": "too many round-trip requests"})
                return
            job.roundtrips += 1
            self._fork_loader(job, str(pt2), threads)
        if payload is not None:
            if job.loader_in is None:
                self._answer(job, {"status": "failed", "reason": "no loader for this payload"})
                return
            with contextlib.suppress(OSError):
                os.write(job.loader_in, (json.dumps({"payload": str(payload)}) + "\n").encode())
            _close(job.loader_in)
            job.loader_in = None

    def _loader_confinement(
        self, dirs: dict[str, str], limits: dict[str, int], gpu: bool, fds: list[int]
    ) -> Confinement:
        """A loader child's confinement; `fds`: output, answer, payload path in."""
        output, answer, payload = fds
        scratch = str(Path(dirs["tmp"]) / "loader")
        conf = self._confinement({**dirs, "tmp": scratch}, limits, [scratch], gpu)
        conf.keep_fds = {1: output, 2: output, 3: answer, 4: payload}
        return conf

    def _fork_loader(self, job: _Job, pt2: str, threads: int) -> None:
        """The second child: a fork of this torch-only process loads the program (a ready
        spare loader when there is one, a fresh fork otherwise), then waits for the
        payload's path on its fd 4."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        job.loader_started = time.perf_counter()
        spare = None if job.gpu else self._take_spare("loader")
        handed = {"op": "load", "pt2": pt2, "threads": threads}
        handed.update(dirs=job.dirs, limits=job.limits)
        fds = [job.output_fd, out_w, in_r]
        if spare is not None and self._hand_over(spare, handed, fds):
            pid = spare.pid
            job.loader_spares += 1
        else:
            conf = self._loader_confinement(job.dirs, job.limits, job.gpu, fds)
            learned = None if job.gpu else self.pages.get("loader")
            pid = os.fork()
            if pid == 0:
                work = lambda: _load(pt2, threads)  # noqa: E731
                self._become_child(conf, work, announce=False, prefault=learned)
        os.close(out_w)
        os.close(in_r)
        job.loader_pid, job.loader_fd, job.loader_out = pid, out_r, b""
        job.loader_in = in_w
        self.selector.register(out_r, selectors.EVENT_READ, ("loader", job.id))

    def _on_loader_output(self, job: _Job) -> None:
        assert job.loader_fd is not None
        try:
            data = os.read(job.loader_fd, 1 << 16)
        except OSError:
            data = b""
        job.loader_out += data
        if b"\n" in job.loader_out or not data or len(job.loader_out) > child.MAX_ANSWER:
            # Answer as soon as the line is complete: the job need not wait for the
            # loader's exit. The loader is done: it is killed now, and reaped later.
            self._finish_loader(job, None)

    def _finish_loader(self, job: _Job, status: int | None) -> None:
        """Answer the job from the loader's output (or its death) and let it go."""
        self._answer_from_loader(job, status)
        _close(job.loader_in)
        job.loader_in = None
        if job.loader_fd is not None:
            self.selector.unregister(job.loader_fd)
            _close(job.loader_fd)
            job.loader_fd = None
        if job.loader_pid is not None:
            if status is None:  # still alive: its answer is all we wanted from it
                _kill_group(job.loader_pid)
                job.old_loaders.append(job.loader_pid)
            job.loader_pid = None

    def _answer_from_loader(self, job: _Job, status: int | None) -> None:
        line = job.loader_out.split(b"\n", 1)[0]
        try:
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError
        except ValueError:
            died = "no answer" if status is None else _describe(status)
            answer = {"status": "failed", "reason": f"the loader died ({died})"}
        answer.setdefault("duration_s", time.perf_counter() - job.loader_started)
        self._answer(job, answer)

    def _answer(self, job: _Job, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            os.write(job.answer_fd, (json.dumps(answer) + "\n").encode())

    # -- spares -----------------------------------------------------------------------
    def _keep_spares(self) -> None:
        """While no job runs, make sure a spare of each kind exists (or is warming)."""
        if not self.spares_enabled or self.jobs:
            return
        for kind in protocol.SPARE_KINDS:
            if kind not in self.spares:
                self._fork_spare(kind)

    def _fork_spare(self, kind: str) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                self._spare_main(kind, theirs)
            finally:
                os._exit(70)
        theirs.close()
        self.spares[kind] = _Spare(kind, pid, ours)
        self.selector.register(ours, selectors.EVENT_READ, ("spare", kind))

    def _spare_main(self, kind: str, sock: socket.socket) -> None:
        """In the spare: warm up, say ready, wait for work, then become that child.
        Runs only the zygote's own code until the work arrives; never returns."""
        try:
            self._detach()
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # an idle spare dies with the zygote
            learned, saved = self.pages.get(kind), None
            if learned is not None:
                pages.prefault(learned)
            else:
                _warm_spare(kind, Path(self.config["warm_dir"]))
                gc.collect()
                gc.freeze()
                if self.maps:
                    saved = self._save_pages(kind)
            data_mb = _status_mb("VmData")
            protocol.send(sock, {"op": "ready", "rss_mb": _status_mb("VmRSS"), "pages": saved})
            message, fds = protocol.receive(sock)
            sock.close()
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
                sys.stderr.flush()
            os._exit(70)
        if message is None:
            os._exit(0)
        try:
            self._become_handed_work(kind, message, fds, data_mb)
        finally:  # never back into the zygote's loop, whatever went wrong
            os._exit(70)

    def _pages_file(self, kind: str, pid: int) -> Path:
        return Path(self.config["warm_dir"]) / f"pages-{kind}-{pid}.bin"

    def _save_pages(self, kind: str) -> str | None:
        """In a spare that warmed up the slow way: write the ranges it touched for the
        zygote (pages.learn); their file's name, None when the page map is unreadable."""
        try:
            path = self._pages_file(kind, os.getpid())
            pages.save(path, pages.learn(self.maps))
        except OSError:
            return None
        return path.name

    def _take_pages(self, spare: _Spare, name: Any) -> None:
        """Keep the ranges a spare learned (the first of its kind that warmed up)."""
        path = self._pages_file(spare.kind, spare.pid)
        if name != path.name:
            return
        learned = pages.load(path)
        with contextlib.suppress(OSError):
            path.unlink()
        if learned is not None and spare.kind not in self.pages:
            self.pages[spare.kind] = learned
            self.learned[spare.kind] = pages.count(learned)

    def _become_handed_work(
        self, kind: str, message: dict[str, Any], fds: list[int], data_mb: int
    ) -> None:
        # RLIMIT_DATA counts what the spare allocated while warming up; the job's own
        # budget stays what it would be in a fresh fork.
        grown = max(0, data_mb - self.data_mb)

        def limits(given: dict[str, int]) -> dict[str, int]:
            return {**given, "memory_mb": int(given["memory_mb"]) + grown}

        if kind == "job" and message.get("op") == "job" and len(fds) == 4:
            run = message["run"]
            conf = self._job_confinement(run["dirs"], limits(run["limits"]), False, fds)
            spec = run["spec"]
            self._become_child(conf, lambda: child.run_export_job(spec), detached=True)
        elif kind == "loader" and message.get("op") == "load" and len(fds) == 3:
            pt2, threads = str(message["pt2"]), int(message["threads"])
            conf = self._loader_confinement(message["dirs"], limits(message["limits"]), False, fds)
            self._become_child(conf, lambda: _load(pt2, threads), announce=False, detached=True)

    def _on_spare(self, kind: str) -> None:
        spare = self.spares.get(kind)
        if spare is None:
            return
        try:
            message, fds = protocol.receive(spare.sock)
        except (OSError, ValueError):
            message, fds = None, []
        for fd in fds:
            _close(fd)
        if message is not None and message.get("op") == "ready" and not spare.ready:
            spare.ready = True
            spare.rss_mb = int(message.get("rss_mb", 0))
            if message.get("pages"):
                self._take_pages(spare, message["pages"])
            self.spare_failures = 0
            self._tell_spares()
            return
        self._drop_spare(spare, failed=True)

    def _take_spare(self, kind: str) -> _Spare | None:
        """The ready spare of this kind, now owned by the caller. Work never waits for a
        spare still warming. One warming up the slow way (~700 ms: nothing learned for
        its kind yet) is killed, so as not to share the CPU with the work; one faulting
        in learned pages (~50 ms) is left to finish, for the round trip or the next job."""
        for other in list(self.spares.values()):
            if not other.ready and other.kind not in self.pages:
                self._drop_spare(other, failed=False)
        spare = self.spares.get(kind)
        if spare is None or not spare.ready:
            return None
        del self.spares[kind]
        self.selector.unregister(spare.sock)
        self._tell_spares()
        return spare

    def _tell_spares(self) -> None:
        """Tell the worker which spares are ready (benchmarks and tests wait for them)."""
        ready = sorted(kind for kind, spare in self.spares.items() if spare.ready)
        with contextlib.suppress(OSError):
            protocol.send(self.ctl, {"op": "spares", "ready": ready, "learned": self.learned})

    def _hand_over(self, spare: _Spare, message: dict[str, Any], fds: list[int]) -> bool:
        try:
            protocol.send(spare.sock, message, fds)
            return True
        except (OSError, ValueError):  # gone, or the message too large: a fresh fork
            _kill_group(spare.pid)
            return False
        finally:
            spare.sock.close()

    def _drop_spare(self, spare: _Spare, failed: bool) -> None:
        if self.spares.get(spare.kind) is not spare:
            return
        del self.spares[spare.kind]
        if spare.ready:
            self._tell_spares()
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(spare.sock)
        spare.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(spare.pid, signal.SIGKILL)
        if failed:
            self.spare_failures += 1
            if self.spare_failures >= MAX_SPARE_FAILURES:
                self.spares_enabled = False
                for other in list(self.spares.values()):  # as the log line says
                    self._drop_spare(other, failed=False)
                print(
                    f"torchport zygote: {self.spare_failures} spares died before they were "
                    "ready; jobs get fresh forks from now on",
                    file=sys.stderr,
                    flush=True,
                )

    # -- reaping ----------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for spare in list(self.spares.values()):
                if pid == spare.pid:
                    self._drop_spare(spare, failed=True)
            for job in list(self.jobs.values()):
                if pid == job.loader_pid:
                    if job.loader_fd is not None:
                        self._drain_loader(job)
                    self._finish_loader(job, status)
                elif pid in job.old_loaders:
                    job.old_loaders.remove(pid)
                elif pid == job.pid:
                    self._finish_job(job, status)

    def _drain_loader(self, job: _Job) -> None:
        assert job.loader_fd is not None
        os.set_blocking(job.loader_fd, False)
        try:
            while len(job.loader_out) <= child.MAX_ANSWER:
                data = os.read(job.loader_fd, 1 << 16)
                if not data:
                    break
                job.loader_out += data
        except OSError:
            pass

    def _finish_job(self, job: _Job, status: int) -> None:
        _kill_group(job.pid)  # anything the job left in its group
        for loader in [job.loader_pid, *job.old_loaders]:
            if loader is not None:  # no process of the job outlives it
                _kill_group(loader)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(loader, 0)
        for fd in (job.request_fd, job.loader_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(fd)
                _close(fd)
        _close(job.answer_fd)
        _close(job.output_fd)
        _close(job.loader_in)
        del self.jobs[job.id]
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        protocol.send(
            self.ctl,
            {
                "op": "exited",
                "id": job.id,
                "code": code,
                "signal": signum,
                "roundtrips": {"loaders": job.roundtrips, "in_spares": job.loader_spares},
            },
        )

    def _shutdown(self) -> None:
        for spare in list(self.spares.values()):
            self._drop_spare(spare, failed=False)
        for job in self.jobs.values():
            for pid in (job.pid, job.loader_pid, *job.old_loaders):
                if pid:
                    _kill_group(pid)
        for job in self.jobs.values():
            for pid in (job.pid, job.loader_pid, *job.old_loaders):
                if pid:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)


def _load(pt2: str, threads: int) -> int:
    """In a loader child: load the program, then wait for the payload's path on fd 4 (the
    job writes the payload meanwhile), run and compare; the one-line answer goes to fd 3."""
    import torch

    from engine import roundtrip

    torch.set_num_threads(threads)
    try:
        loaded = roundtrip.load_saved(pt2)
        request = child.read_line(4, MAX_REQUEST)
        if not request.endswith(b"\n") and len(request) < MAX_REQUEST:
            return 0  # the job went away or sent no payload: nothing to answer
        payload = str(json.loads(request)["payload"])
        answer = roundtrip.run_loaded(loaded, payload)
    except Exception as exc:
        answer = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:2000]}
    os.write(3, (json.dumps(answer) + "\n").encode())
    return 0


def _warm_spare(kind: str, warm: Path) -> None:
    """A spare's own warm-up, in its own address space: the whole pipeline once more for
    a job spare, the load and run of the zygote's warm-up program for a loader spare."""
    import torch

    with cuda_hidden(torch):
        if kind == "job":
            scratch = warm / f"spare-{os.getpid()}"
            scratch.mkdir()
            try:
                _warm_full_pipeline(scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        else:
            child.check_roundtrip(
                str(warm.joinpath(*WARM_PROGRAM)), str(warm.joinpath(*WARM_PAYLOAD))
            )


_WARM_MODEL = """
import torch
model = torch.nn.TransformerEncoderLayer(
    d_model=8, nhead=2, dim_feedforward=16, batch_first=True, dropout=0.0
).eval()
example_args = (torch.randn(1, 3, 8),)
"""


def _warm_full_pipeline(warm: Path) -> None:
    """Run the whole pipeline once (attention, decomposition tables, verification, the
    save and the load of the round trip) on tiny shapes, so that children inherit every
    lazy import and cache. Tiny shapes never enter a parallel region, so torch's
    intra-op thread pool is not started (tests prove forked children never hang)."""
    from engine import pipeline, roundtrip
    from engine.model import Upload
    from schemas import ExportOptions

    source = warm / "warm_model.py"
    source.write_text(_WARM_MODEL)

    pipeline.run_export(
        pipeline.ExportRequest(
            upload=Upload(model=source),
            options=ExportOptions(),
            out_dir=warm / "out",
            work_dir=warm / "work",
        ),
        roundtrip_runner=lambda pt2, payload: roundtrip.run_in_process(pt2, payload, "zygote"),
    )


@contextlib.contextmanager
def cuda_hidden(torch: Any) -> Iterator[None]:
    """Make `torch.cuda.is_available()` False (and `device_count()` 0) without asking the
    driver, for the zygote's warm-up.

    torch.export asks `is_available()` on every fake-tensor mode it enters and, in
    `preserve_rng_state`, reads the CUDA RNG state when it says yes. The first calls
    `cudaGetDeviceCount`, which initializes the driver and marks every later fork "bad"
    (torch then refuses CUDA there: "Cannot re-initialize CUDA in forked subprocess");
    the second creates a CUDA context. Either would leave no job child able to use the
    GPU. The warm-up runs on the CPU, so the answer it sees changes nothing it caches.
    """
    cuda = torch.cuda
    saved = (cuda.is_available, cuda.device_count)
    cuda.is_available, cuda.device_count = (lambda: False), (lambda: 0)
    try:
        yield
    finally:
        cuda.is_available, cuda.device_count = saved


def _children_in_bad_fork(torch: Any) -> bool:
    """Whether torch would refuse CUDA in a child forked now (a throw-away fork asks)."""
    in_bad_fork = getattr(torch._C, "_cuda_isInBadFork", None)
    if in_bad_fork is None:  # a CPU-only build of torch
        return False
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(1 if in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


MADV_COLLAPSE = 25
HUGE_PAGE = 1 << 21


def collapse_heap() -> int:
    """Back the zygote's anonymous memory with transparent huge pages (MADV_COLLAPSE,
    Linux 6.1+); returns the MB now in huge pages (0 where the kernel cannot).

    fork() copies, and exit() tears down, one page-table entry per 4 KiB page of
    anonymous memory: for a zygote holding ~270 MB of Python and torch heap, about
    12 ms each per job. In 2 MiB pages both take a few ms. A child's first write to a
    shared huge page still copies only that 4 KiB page (the kernel splits the mapping
    in the child), so children do not grow; the zygote's resident size barely changes.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as handle:
            maps = handle.read().splitlines()
    except OSError:
        return 0
    for line in maps:
        fields = line.split()
        name = fields[5] if len(fields) > 5 else ""
        if name not in ("", "[heap]") or not fields[1].startswith("rw"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end &= ~(HUGE_PAGE - 1)
        if end - start < HUGE_PAGE:
            continue
        failed = libc.madvise(start, end - start, MADV_COLLAPSE) != 0
        if failed and ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):  # no MADV_COLLAPSE
            break
    return _status_kb("AnonHugePages", "/proc/self/smaps_rollup") // 1024


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _status_kb(field_name: str, path: str = "/proc/self/status") -> int:
    with open(path) as handle:
        for line in handle:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _status_mb(field_name: str) -> int:
    return _status_kb(field_name) // 1024 + 1


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _close(fd: int | None) -> None:
    if fd is None or fd < 0:
        return
    with contextlib.suppress(OSError):
        os.close(fd)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python -I -c '...main()' CTL_FD`."""
    args = sys.argv[1:] if argv is None else argv
    set_dumpable(False)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctl = socket.socket(fileno=int(args[0]))
    zygote = Zygote(ctl)
    zygote.start()
    zygote.serve()
