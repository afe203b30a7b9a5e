"""The zygote: a long-lived process that imported torch and the engine and ran one
tiny export, then forks one locked-down child per job.

It is exec'd by the worker with a scrubbed environment (inside bubblewrap when
the host allows it) and talks to the worker over one control socket (fd given on
the command line). It never runs uploaded code and never starts torch's intra-op
thread pool (a forked child of a process that has would hang); it never touches
CUDA. When the control socket closes, it kills its children and exits.

Messages (worker → zygote): `config`, `run` (with two fds: progress, output),
`kill`. (zygote → worker): `hello`, `started`, `exited`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.sandbox import child, protocol
from worker.sandbox.gpu import GpuAccess
from worker.sandbox.lockdown import Confinement, Limits, LockdownError, apply, set_dumpable

MAX_ROUNDTRIPS = 4
MAX_REQUEST = 1 << 14


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
    loader_pid: int | None = None
    loader_fd: int | None = None
    loader_out: bytes = b""
    loader_started: float = 0.0
    closed: list[int] = field(default_factory=list)
    gpu: bool = False


class Zygote:
    """The fork server."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.config: dict[str, Any] = {}
        self.jobs: dict[str, _Job] = {}
        self.selector = selectors.DefaultSelector()
        self.gpu: GpuAccess | None = None

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
        cuda_initialized = bool(torch.cuda.is_initialized())
        cuda_poisoned = _children_in_bad_fork(torch)
        if self.gpu is not None and (cuda_initialized or cuda_poisoned):
            raise SystemExit(
                "the zygote touched CUDA during its warm-up "
                f"(initialized={cuda_initialized}, fork poisoned={cuda_poisoned}); "
                "its children could not use the GPU"
            )
        protocol.send(
            self.ctl,
            {
                "op": "hello",
                "pid": os.getpid(),
                "threads": _thread_count(),
                "data_mb": _status_mb("VmData"),
                "rss_mb": _status_mb("VmRSS"),
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
                    kind, job_id = key.data
                    job = self.jobs.get(job_id)
                    if job is not None:
                        if kind == "request":
                            self._on_request(job)
                        else:
                            self._on_loader_output(job)
            self._reap()

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
        conf = self._confinement(dirs, limits, [dirs["out"], dirs["tmp"]], gpu)
        conf.keep_fds = {1: output_fd, 2: output_fd, 3: progress_fd, 4: req_w, 5: ans_r}
        pid = os.fork()
        if pid == 0:
            self._become_child(conf, lambda: child.run_export_job(message["spec"]))
        os.close(req_w)
        os.close(ans_r)
        job = _Job(job_id, pid, os.dup(output_fd), req_r, ans_w, dirs, limits, gpu=gpu)
        self.jobs[job_id] = job
        self.selector.register(req_r, selectors.EVENT_READ, ("request", job_id))
        protocol.send(self.ctl, {"op": "started", "id": job_id, "pid": pid})

    def _become_child(self, conf: Confinement, work: Any, announce: bool = True) -> None:
        code = 70
        try:
            self.selector.close()
            self.ctl.close()
            signal.set_wakeup_fd(-1)
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
        if b"\n" not in job.buffer:
            return
        line, job.buffer = job.buffer.split(b"\n", 1)
        if job.loader_pid is not None or job.roundtrips >= MAX_ROUNDTRIPS:
            self._answer(job, {"status": "failed", "reason": "too many round-trip requests"})
            return
        try:
            request = json.loads(line)
            pt2, payload = str(request["pt2"]), str(request["payload"])
        except (ValueError, KeyError, TypeError):
            self._answer(job, {"status": "failed", "reason": "malformed round-trip request"})
            return
        job.roundtrips += 1
        self._fork_loader(job, pt2, payload)

    def _fork_loader(self, job: _Job, pt2: str, payload: str) -> None:
        """The second child: a fresh fork of this torch-only process loads the program."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        scratch = Path(job.dirs["tmp"]) / "loader"
        conf = self._confinement(
            {**job.dirs, "tmp": str(scratch)}, job.limits, [str(scratch)], job.gpu
        )
        conf.keep_fds = {1: job.output_fd, 2: job.output_fd, 3: out_w}

        def load() -> int:
            try:
                answer = child.check_roundtrip(pt2, payload)
            except Exception as exc:
                answer = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:2000]}
            os.write(3, (json.dumps(answer) + "\n").encode())
            return 0

        pid = os.fork()
        if pid == 0:
            self._become_child(conf, load, announce=False)
        os.close(out_w)
        job.loader_pid, job.loader_fd, job.loader_out = pid, out_r, b""
        job.loader_started = time.perf_counter()
        self.selector.register(out_r, selectors.EVENT_READ, ("loader", job.id))

    def _on_loader_output(self, job: _Job) -> None:
        assert job.loader_fd is not None
        try:
            data = os.read(job.loader_fd, 1 << 16)
        except OSError:
            data = b""
        job.loader_out += data
        if data and len(job.loader_out) <= child.MAX_ANSWER:
            return
        self.selector.unregister(job.loader_fd)
        _close(job.loader_fd)
        job.loader_fd = None

    def _finish_loader(self, job: _Job, status: int) -> None:
        line = job.loader_out.split(b"\n", 1)[0]
        try:
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError
        except ValueError:
            answer = {"status": "failed", "reason": f"the loader died ({_describe(status)})"}
        answer.setdefault("duration_s", time.perf_counter() - job.loader_started)
        if job.loader_fd is not None:
            self.selector.unregister(job.loader_fd)
            _close(job.loader_fd)
            job.loader_fd = None
        job.loader_pid = None
        self._answer(job, answer)

    def _answer(self, job: _Job, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            os.write(job.answer_fd, (json.dumps(answer) + "\n").encode())

    # -- reaping ----------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for job in list(self.jobs.values()):
                if pid == job.loader_pid:
                    if job.loader_fd is not None:
                        self._drain_loader(job)
                    self._finish_loader(job, status)
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
        if job.loader_pid is not None:
            _kill_group(job.loader_pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(job.loader_pid, 0)
        for fd in (job.request_fd, job.loader_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(fd)
                _close(fd)
        _close(job.answer_fd)
        _close(job.output_fd)
        del self.jobs[job.id]
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        protocol.send(self.ctl, {"op": "exited", "id": job.id, "code": code, "signal": signum})

    def _shutdown(self) -> None:
        for job in self.jobs.values():
            _kill_group(job.pid)
            if job.loader_pid:
                _kill_group(job.loader_pid)
        for job in self.jobs.values():
            for pid in (job.pid, job.loader_pid):
                if pid:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)


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


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _status_mb(field_name: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) // 1024 + 1
    return 0


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
