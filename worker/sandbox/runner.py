"""The worker side of the sandbox: starts the zygote, hands it jobs, enforces
wall-clock time and memory, and reads what a job wrote back as untrusted data.

No process here ever imports the user's code, unpickles a job's output or calls
`torch.export.load`: the save → load round trip runs in a second sandboxed child.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import os
import platform
import queue
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

from pydantic import BaseModel, ValidationError

from engine.artifacts import GRAPH, PROGRAM, REPORT, SIGNATURE, artifact_info
from schemas import (
    ArtifactInfo,
    Environment,
    ErrorBody,
    ExportOptions,
    GraphDocument,
    Progress,
    ReportDocument,
    SandboxReport,
    SignatureDocument,
)
from worker.sandbox import bubblewrap, gpu, layers, lockdown, protocol
from worker.sandbox.gpu import GpuAccess
from worker.sandbox.settings import SandboxJob, SandboxResult, SandboxSettings

ProgressCallback = Callable[[Progress], None]

LOG = "sandbox.log"
TAIL_BYTES = 8192
_ZIP_MAGIC = b"PK\x03\x04"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot start on this host with these settings."""


@dataclass
class _Watch:
    """What the worker learns about one running job."""

    messages: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    lockdown: dict[str, Any] | None = None
    refused: tuple[str, str] | None = None
    bad_lines: int = 0
    spare: bool = False
    """The job ran in a pre-forked, self-warmed spare child rather than a fresh fork."""
    prefault: bool = False
    """A fresh fork that faulted in the pages a spare's warm-up touches before the job."""
    done: bool = False
    """The child said its outputs are written (it is about to exit)."""
    accepted: _Accepted | None = None
    """Its outputs, read, validated and copied out of its reach while it exited."""
    roundtrips: dict[str, int] | None = None
    """Round trips the zygote ran for the job: how many, how many in a spare loader."""


@dataclass
class _Accepted:
    """A job's outputs as the worker took them (`_take_outputs`): validated, and when
    taken while the job exits, copied where it cannot reach them and hashed as copied."""

    report: ReportDocument
    files: dict[str, Path]
    infos: dict[str, ArtifactInfo]
    """Size and SHA-256 of each copy, as copied (empty when taken after the exit)."""
    directory: Path | None
    """Where the copies are (None when taken after the exit)."""


class _Zygote:
    """The zygote process, its control socket and the thread that reads it."""

    def __init__(
        self,
        argv: list[str],
        config: dict[str, Any],
        log: Path,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        with log.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [*argv, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=_zygote_environment(env),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                cwd="/",
            )
        theirs.close()
        self.lock = threading.Lock()
        self.watches: dict[str, _Watch] = {}
        self.alive = True
        self.hello: queue.Queue[dict[str, Any]] = queue.Queue()
        self.spares = threading.Condition()
        self.spares_ready: tuple[str, ...] = ()
        self.learned_pages: dict[str, dict[str, int]] = {}
        """Per spare kind, the pages its warm-up touched, once learned (zygote pages.py)."""
        protocol.send(self.sock, {"op": "config", **config})
        self.reader = threading.Thread(target=self._read, name="sandbox-zygote", daemon=True)
        self.reader.start()
        try:
            self.info = self.hello.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise SandboxUnavailable(f"the zygote did not start in {timeout:.0f} s") from None
        if self.info.get("op") != "hello":
            self.stop()
            tail = log.read_bytes()[-2000:].decode(errors="replace")
            raise SandboxUnavailable(f"the zygote failed to start: {tail}")
        self.outer_pid = _outer_pid(self.proc.pid, int(self.info["pid"]))

    def _read(self) -> None:
        while True:
            try:
                message, fds = protocol.receive(self.sock)
            except (OSError, ValueError):
                message, fds = None, []
            for fd in fds:
                os.close(fd)
            if message is None:
                break
            if message.get("op") == "hello":
                self.hello.put(message)
                continue
            if message.get("op") == "spares":
                with self.spares:
                    self.spares_ready = tuple(str(k) for k in message.get("ready") or ())
                    self.learned_pages = dict(message.get("learned") or {})
                    self.spares.notify_all()
                continue
            watch = self.watches.get(str(message.get("id")))
            if watch is not None:
                watch.messages.put(message)
        self.alive = False
        with self.spares:
            self.spares_ready = ()
            self.spares.notify_all()
        self.hello.put({"op": "dead"})
        for watch in list(self.watches.values()):
            watch.messages.put({"op": "dead"})

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        with self.lock:
            protocol.send(self.sock, message, fds)

    def inner_to_outer(self, inner: int) -> int | None:
        """The worker-side pid of a zygote child (they differ inside bwrap's pid namespace)."""
        if self.outer_pid is None:
            return None
        if self.outer_pid == int(self.info["pid"]):
            return inner
        return _find_child(self.outer_pid, inner)

    def healthy(self) -> bool:
        """Whether the zygote still runs and its socket is open."""
        if not self.alive or self.proc.poll() is not None or self.outer_pid is None:
            return False
        try:
            with open(f"/proc/{self.outer_pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")

    def stop(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.sock.close()
        # On EOF the zygote kills its children itself; give it a moment, then insist.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class SandboxRunner:
    """Runs exports in sandboxed children forked from a warm zygote.

    Use as a context manager, or call `start()` and `close()`. `run` is safe to call
    from several threads at once.
    """

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self._zygote: _Zygote | None = None
        self._host: layers.HostLayers | None = None
        self._bwrap: str | None = None
        self._lock = threading.Lock()
        self._owned_root: Path | None = None
        self._counter = itertools.count()
        self._gpu: GpuAccess | None = None
        self._cleaner: _Cleaner | None = None
        self.work_root = self.settings.work_root
        self.restarts = 0

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> SandboxRunner:
        """Probe the host's layers and start the zygote (a no-op when disabled)."""
        if not self.settings.enabled:
            print(
                "torchport: SANDBOX DISABLED: uploaded code runs unconfined in this process",
                file=sys.stderr,
            )
            return self
        lockdown.set_dumpable(False)  # the worker's memory and environ stay closed
        if self.work_root is None:
            self._owned_root = Path(tempfile.mkdtemp(prefix="torchport-sandbox-"))
            self.work_root = self._owned_root
        self.work_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work_root, 0o711)  # the job uid must traverse it to its own dir
        self.jobs_root.mkdir(exist_ok=True)
        os.chmod(self.jobs_root, 0o711)
        self._cleaner = _Cleaner(self.work_root / "trash")
        warm = self.jobs_root / ".warm"
        warm.mkdir(exist_ok=True)
        os.chmod(warm, 0o700)
        want = self.settings.use_bwrap
        if self.settings.gpu:
            self._gpu = gpu.discover(
                cuda_visible_devices=self.settings.cuda_visible_devices,
                nvidia_visible_devices=self.settings.nvidia_visible_devices,
                library_dirs=self.settings.gpu_library_dirs,
            )
        self._host = layers.probe(
            lockdown.code_paths(), self._python(), try_bwrap=want is not False, gpu=self._gpu
        )
        if not self._host.seccomp:
            raise SandboxUnavailable(
                "seccomp cannot be installed here, so no job may run: "
                + self._host.notes.get("seccomp", "")
            )
        if self._host.landlock_abi == 0 and self.landlock_note() is None:
            raise SandboxUnavailable(
                "Landlock is not available here ("
                + self._host.notes.get("landlock", "")
                + "), and this is not gVisor; set allow_without_landlock to run jobs "
                "without it (recorded in every report)"
            )
        if want is True and self._host.bwrap is None:
            raise SandboxUnavailable("bubblewrap was required: " + self._host.notes["bwrap"])
        self._bwrap = self._host.bwrap
        self._spawn()
        return self

    def close(self) -> None:
        """Stop the zygote (killing any job still running) and remove owned files."""
        with self._lock:
            if self._zygote is not None:
                self._zygote.stop()
                self._zygote = None
        if self._cleaner is not None:
            self._cleaner.close()
            self._cleaner = None
        if self._owned_root is not None:
            shutil.rmtree(self._owned_root, ignore_errors=True)
            self._owned_root = None

    def __enter__(self) -> SandboxRunner:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def jobs_root(self) -> Path:
        """Where jobs are staged (the only writable place a job can see)."""
        assert self.work_root is not None, "start() first"
        return self.work_root / "jobs"

    @property
    def host(self) -> layers.HostLayers | None:
        """The layers this host supports (after `start()`)."""
        return self._host

    def wait_for_spares(self, timeout: float) -> bool:
        """Wait until the zygote's spare job child and loader child are warm and ready
        (the state of a worker that has been idle for a second or so); False when spares
        are off or did not get ready in time. For benchmarks and tests."""
        zygote = self._zygote
        if zygote is None or not zygote.info.get("spares"):
            return False
        wanted = set(protocol.SPARE_KINDS)
        with zygote.spares:
            return zygote.spares.wait_for(
                lambda: wanted <= set(zygote.spares_ready) or not zygote.alive, timeout
            ) and wanted <= set(zygote.spares_ready)

    def learned_pages(self) -> dict[str, dict[str, int]]:
        """Per spare kind, the pages (write, read) its first warm-up touched, which later
        spares and fresh forks fault in ahead of their work; empty until learned."""
        zygote = self._zygote
        if zygote is None:
            return {}
        with zygote.spares:
            return dict(zygote.learned_pages)

    def zygote_children(self) -> list[int]:
        """The zygote's live children as this process sees them (its spares, while no job
        runs); empty without a zygote."""
        pid = self.zygote_pid
        return _children(pid) if pid is not None else []

    @property
    def zygote_pid(self) -> int | None:
        """The zygote's pid as this process sees it."""
        zygote = self._zygote
        return zygote.outer_pid if zygote is not None else None

    def expected_layers(self) -> list[str]:
        """The layers every job must have in force on this host."""
        if not self.settings.enabled:
            return ["none"]
        assert self._host is not None
        expected = ["zygote", "rlimits", "no_new_privs", "seccomp"]
        if self.settings.job_ids() is not None:
            expected.append("uid")
        if self._host.landlock_abi > 0:
            expected.append("landlock")
        if self._bwrap is not None:
            expected.append("bwrap")
        return expected

    @property
    def gpu_access(self) -> GpuAccess | None:
        """What this GPU worker's CUDA jobs may use beyond a CPU job (after `start()`)."""
        return self._gpu

    def landlock_note(self) -> str | None:
        """Why jobs run without Landlock ("unavailable (gvisor)", …); None when they may
        not (the runner then refuses to start) or Landlock is in force."""
        host = self._host
        if host is None or host.landlock_abi > 0:
            return None
        note = host.notes.get("landlock", "unavailable")
        if host.gvisor and note == layers.LANDLOCK_GVISOR:
            return note
        if self.settings.allow_without_landlock:
            return f"{note}; allowed by allow_without_landlock"
        return None

    def _python(self) -> str:
        return self.settings.python or sys.executable

    def _spawn(self) -> None:
        assert self._host is not None and self.work_root is not None
        import worker

        root = str(Path(worker.__file__).resolve().parent.parent)
        boot = (
            f"import sys; sys.path.insert(0, {root!r}); "
            "from worker.sandbox.zygote import main; main()"
        )
        argv = [self._python(), "-I", "-c", boot]
        if self._bwrap is not None:
            prefix = bubblewrap.command(
                self._bwrap,
                lockdown.code_paths(),
                jobs_root=self.jobs_root,
                tmpfs_mb=self.settings.tmpfs_mb,
                gpu=self._gpu,
            )
            argv = [*prefix, *argv]
        ids = self.settings.job_ids()
        config = {
            "read_paths": [str(p) for p in lockdown.code_paths()],
            "uid": ids[0] if ids else None,
            "gid": ids[1] if ids else None,
            "landlock": self._host.landlock_abi > 0,
            "warm_up": self.settings.warm_up,
            "spares": self.settings.spares,
            "warm_dir": str(self.jobs_root / ".warm"),
            "gpu": self._gpu.to_json() if self._gpu is not None else None,
        }
        self._zygote = _Zygote(
            argv,
            config,
            self.work_root / "zygote.log",
            self.settings.start_timeout_s,
            env=self._gpu.environment if self._gpu is not None else None,
        )

    def _live_zygote(self) -> _Zygote:
        with self._lock:
            zygote = self._zygote
            if zygote is None or not zygote.healthy():
                if zygote is not None:
                    zygote.stop()
                    self.restarts += 1
                self._spawn()
            assert self._zygote is not None
            return self._zygote

    # -- one job ----------------------------------------------------------------------
    def run(
        self,
        job: SandboxJob,
        *,
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> SandboxResult:
        """Run one export; never raises for anything the uploaded code does."""
        started = time.perf_counter()
        out_dir = job.job_dir / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            options = ExportOptions.model_validate(job.options)
        except ValidationError as exc:
            error = ErrorBody(
                code="invalid_request",
                message="The export options are invalid.",
                details={"errors": json.loads(exc.json(include_url=False, include_input=False))},
            )
            return self._finish(job, None, error, "", started, {})
        if not self.settings.enabled:
            return self._run_unsandboxed(job, options, on_progress, started)
        job_id = f"{os.getpid()}-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        staging = self.jobs_root / job_id
        try:
            spec = self._stage(job, staging)
            return self._run_staged(
                job, options, job_id, staging, spec, on_progress, cancel, started
            )
        finally:
            if self._cleaner is not None:
                self._cleaner.remove(staging)
            else:
                shutil.rmtree(staging, ignore_errors=True)

    def wait_for_cleanup(self, timeout: float) -> bool:
        """Wait until the staging directories of finished jobs are deleted (that happens
        in the background, after `run` returned); False if not within `timeout`."""
        return self._cleaner is None or self._cleaner.flush(timeout)

    def _stage(self, job: SandboxJob, staging: Path) -> dict[str, Any]:
        """Copy the uploads into a fresh directory only this job's uid can enter."""
        dirs = {name: staging / name for name in ("in", "out", "tmp")}
        for path in (staging, *dirs.values(), dirs["tmp"] / "loader", dirs["tmp"] / "work"):
            path.mkdir(mode=0o700)
        spec: dict[str, Any] = {"options": job.options}
        for name in ("model", "inputs", "weights"):
            source: Path | None = getattr(job, name)
            if source is None:
                spec[name] = None
                continue
            target = dirs["in"] / source.name
            shutil.copyfile(source, target)
            spec[name] = str(target)
        spec["out_dir"], spec["work_dir"] = str(dirs["out"]), str(dirs["tmp"] / "work")
        ids = self.settings.job_ids()
        if ids is not None:
            for dirpath, _dirnames, filenames in os.walk(staging):
                os.chown(dirpath, *ids)
                for filename in filenames:
                    os.chown(os.path.join(dirpath, filename), *ids)
        return spec

    def _limits(
        self, options: ExportOptions, baseline_mb: int, gpu_job: bool = False
    ) -> tuple[dict[str, int], float]:
        timeout = min(float(options.timeout_s), self.settings.max_timeout_s)
        memory = min(options.memory_mb, self.settings.max_memory_mb)
        cpu = self.settings.cpu_s or int(timeout * (os.cpu_count() or 1)) + 10
        margin = self.settings.gpu_data_margin_mb if gpu_job else 0
        limits = {
            # RLIMIT_DATA counts what the child inherited from the zygote, too.
            "memory_mb": memory + baseline_mb + margin,
            "cpu_s": cpu,
            "fsize_mb": self.settings.fsize_mb,
            "nofile": self.settings.nofile,
            "nproc": self.settings.nproc,
        }
        return limits, timeout

    def is_gpu_job(self, options: ExportOptions) -> bool:
        """Whether a job gets the GPU confinement: a CUDA job on a GPU worker. A CUDA job
        on a CPU worker keeps the CPU confinement and finds no GPU (`invalid_request`)."""
        return self._gpu is not None and options.device == "cuda"

    def _run_staged(
        self,
        job: SandboxJob,
        options: ExportOptions,
        job_id: str,
        staging: Path,
        spec: dict[str, Any],
        on_progress: ProgressCallback | None,
        cancel: threading.Event | None,
        started: float,
    ) -> SandboxResult:
        zygote = self._live_zygote()
        baseline_mb = int(zygote.info.get("data_mb", 0))
        gpu_job = self.is_gpu_job(options)
        limits, timeout = self._limits(options, baseline_mb, gpu_job)
        rss_margin = self.settings.gpu_rss_margin_mb if gpu_job else 0
        memory_bytes = (options.memory_mb + int(zygote.info.get("rss_mb", 0)) + rss_margin) << 20
        watch = _Watch()
        zygote.watches[job_id] = watch
        progress_r, progress_w = os.pipe2(os.O_CLOEXEC)
        output_r, output_w = os.pipe2(os.O_CLOEXEC)
        log = _CappedLog(job.job_dir / LOG, self.settings.max_log_bytes)
        reader = threading.Thread(
            target=self._drain,
            args=(progress_r, output_r, watch, log, on_progress),
            name=f"sandbox-job-{job_id}",
            daemon=True,
        )
        reader.start()
        dirs = {name: str(staging / name) for name in ("in", "out", "tmp")}
        dirs["root"] = str(staging)
        try:
            zygote.send(
                {
                    "op": "run",
                    "id": job_id,
                    "spec": spec,
                    "dirs": dirs,
                    "limits": limits,
                    "gpu": gpu_job,
                },
                [progress_w, output_w],
            )
        except OSError:
            watch.messages.put({"op": "dead"})
        finally:
            os.close(progress_w)
            os.close(output_w)
        accepted_dir = job.job_dir / ".accepted"

        def accept_early() -> None:
            # The child's address space takes milliseconds to tear down (12 ms for a
            # transformer block); the outputs are read back meanwhile, into copies.
            try:
                watch.accepted = self._take_outputs(staging / "out", accepted_dir)
            except (_Untrusted, OSError):
                shutil.rmtree(accepted_dir, ignore_errors=True)  # read again after the exit

        verdict, exit_info = self._supervise(
            zygote, job_id, watch, timeout, memory_bytes, cancel, accept_early
        )
        zygote.watches.pop(job_id, None)
        reader.join(timeout=self.settings.kill_grace_s)
        log.close()
        error = _error_for(verdict, exit_info, watch, timeout, options.memory_mb)
        details: dict[str, Any] = {
            "in_force": watch.lockdown or {},
            "spare": watch.spare,
            "prefault": watch.prefault,
            "roundtrips": watch.roundtrips,
            "exit": exit_info,
            "zygote_restarts": self.restarts,
        }
        note = self.landlock_note()
        if note is not None:
            details["landlock"] = note
        return self._finish(job, staging / "out", error, log.tail(), started, details, watch)

    def _supervise(
        self,
        zygote: _Zygote,
        job_id: str,
        watch: _Watch,
        timeout: float,
        memory_bytes: int,
        cancel: threading.Event | None,
        on_done: Callable[[], None] = lambda: None,
    ) -> tuple[str | None, dict[str, Any]]:
        """Wait for the job; kill its process group on timeout, memory or cancel.
        `on_done` runs when the child says its outputs are written, while it exits."""
        deadline = time.monotonic() + timeout
        outer: int | None = None
        verdict: str | None = None
        while True:
            try:
                message = watch.messages.get(timeout=0.05)
            except queue.Empty:
                message = None
            if message is not None:
                op = message.get("op")
                if op == "started":
                    outer = zygote.inner_to_outer(int(message["pid"]))
                    watch.spare = bool(message.get("spare"))
                    watch.prefault = bool(message.get("prefault"))
                    # A spare's warm-up left it this much more resident than the zygote.
                    memory_bytes += max(0, int(message.get("extra_rss_mb") or 0)) << 20
                elif op == "exited":
                    trips = message.get("roundtrips")
                    if isinstance(trips, dict):
                        watch.roundtrips = {str(k): int(v) for k, v in trips.items()}
                    return verdict, {"code": message.get("code"), "signal": message.get("signal")}
                elif op == "dead":
                    return verdict or "zygote_died", {}
                elif op == "done" and verdict is None:
                    on_done()
                continue
            if verdict is None:
                if cancel is not None and cancel.is_set():
                    verdict = "canceled"
                elif time.monotonic() > deadline:
                    verdict = "timeout"
                elif outer is not None and _rss(outer) > memory_bytes:
                    verdict = "out_of_memory"
                if verdict is not None:
                    self._kill(zygote, job_id, outer)
                    deadline = time.monotonic() + self.settings.kill_grace_s
            elif time.monotonic() > deadline:
                # The zygote did not confirm the kill: it is wedged, so replace it.
                zygote.stop()
                return verdict, {}

    def _kill(self, zygote: _Zygote, job_id: str, outer: int | None) -> None:
        if outer is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(outer, signal.SIGKILL)
        with contextlib.suppress(OSError):
            zygote.send({"op": "kill", "id": job_id})

    def _drain(
        self,
        progress_fd: int,
        output_fd: int,
        watch: _Watch,
        log: _CappedLog,
        on_progress: ProgressCallback | None,
    ) -> None:
        """Read the job's progress lines and output until both pipes close."""
        limit = self.settings.max_progress_line
        pending = b""
        with selectors.DefaultSelector() as selector:
            selector.register(progress_fd, selectors.EVENT_READ, "progress")
            selector.register(output_fd, selectors.EVENT_READ, "output")
            open_fds = 2
            while open_fds:
                for key, _ in selector.select():
                    fd = key.fd
                    data = os.read(fd, 1 << 16)
                    if not data:
                        selector.unregister(fd)
                        os.close(fd)
                        open_fds -= 1
                        continue
                    if key.data == "output":
                        log.write(data)
                        continue
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    if len(pending) > limit:
                        pending = b""
                        watch.bad_lines += 1
                    for line in lines:
                        self._on_line(line, watch, on_progress)

    def _on_line(self, line: bytes, watch: _Watch, on_progress: ProgressCallback | None) -> None:
        try:
            message = json.loads(line)
            if "progress" in message:
                progress = Progress.model_validate(message["progress"])
                if on_progress is not None:
                    with contextlib.suppress(Exception):
                        on_progress(progress)
            elif "lockdown" in message and watch.lockdown is None:
                watch.lockdown = {
                    k: v for k, v in dict(message["lockdown"]).items() if k in _IN_FORCE
                }
            elif message.get("done") is True and not watch.done:
                watch.done = True
                watch.messages.put({"op": "done"})
            elif "refused" in message and watch.refused is None:
                code = str(message["refused"])
                code = code if code in _REFUSAL_CODES else "sandbox_violation"
                watch.refused = (code, str(message.get("message", ""))[:2000])
            else:
                watch.bad_lines += 1
        except (ValueError, TypeError, AttributeError, ValidationError):
            watch.bad_lines += 1

    # -- results ----------------------------------------------------------------------
    def _finish(
        self,
        job: SandboxJob,
        produced: Path | None,
        error: ErrorBody | None,
        tail: str,
        started: float,
        details: dict[str, Any],
        watch: _Watch | None = None,
    ) -> SandboxResult:
        out_dir = job.job_dir / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        report: ReportDocument | None = None
        found: dict[str, Path] = {}
        infos: dict[str, ArtifactInfo] = {}
        accepted = watch.accepted if watch is not None else None
        if accepted is not None and error is None:
            report, found, infos = accepted.report, accepted.files, accepted.infos
        elif produced is not None and error is None:
            try:
                taken = self._take_outputs(produced)
                assert taken is not None  # only a copy is ever declined
                report, found = taken.report, taken.files
            except _Untrusted as exc:
                error = ErrorBody(
                    code="internal_error",
                    message=f"The job's results were rejected: {exc}",
                    hint="This is a bug in torchport, not in your model; please report it.",
                )
        if error is not None or report is None:
            error = error or ErrorBody(
                code="internal_error",
                message="The job ended without a report.",
                hint="This is a bug in torchport, not in your model; please report it.",
            )
            report = _failed_report(error, time.perf_counter() - started)
            found = {}
        artifacts: dict[str, Path] = {}
        for name, path in found.items():
            target = out_dir / name
            try:
                os.replace(path, target)
            except OSError:
                shutil.copyfile(path, target)
            artifacts[name] = target
        if accepted is not None and accepted.directory is not None:
            shutil.rmtree(accepted.directory, ignore_errors=True)
        report.sandbox = SandboxReport(layers=self._layers(watch), details=details)
        report.artifacts = [
            infos.get(name) or artifact_info(path) for name, path in artifacts.items()
        ]
        report_path = out_dir / REPORT
        report_path.write_text(report.model_dump_json(indent=2))
        artifacts[REPORT] = report_path
        return SandboxResult(
            report=report, artifacts=artifacts, error=report.error, stdout_tail=tail
        )

    def _layers(self, watch: _Watch | None) -> list[str]:
        if not self.settings.enabled:
            return ["none"]
        in_force = (watch.lockdown if watch is not None else None) or {}
        if not in_force:
            return []
        layers_in_force = ["zygote", "rlimits"]
        if in_force.get("no_new_privs"):
            layers_in_force.append("no_new_privs")
        if self.settings.job_ids() is not None and in_force.get("uid") not in (None, 0):
            layers_in_force.append("uid")
        if in_force.get("landlock_abi"):
            layers_in_force.append("landlock")
        if in_force.get("seccomp"):
            layers_in_force.append("seccomp")
        if self._bwrap is not None:
            layers_in_force.append("bwrap")
        return layers_in_force

    def _take_outputs(self, produced: Path, into: Path | None = None) -> _Accepted | None:
        """A job's outputs, checked as untrusted data: regular files (no links), size
        limits, documents validated against their schemas, the program a zip archive.

        After the job's exit (`into` None) they are taken where they are. While it is
        still exiting, each is copied into `into` (out of the job's reach) as it is
        validated and hashed, so what is accepted is what is kept, whatever the job's
        threads write afterwards; None then when the program is larger than
        `early_copy_bytes` (moved after the exit instead: copying it would cost more
        than the exit it overlaps)."""
        s = self.settings
        program = produced / PROGRAM
        if into is not None:
            with contextlib.suppress(FileNotFoundError):
                if program.lstat().st_size > s.early_copy_bytes:
                    return None
            shutil.rmtree(into, ignore_errors=True)
            into.mkdir(mode=0o700, parents=True)
        limits = {REPORT: s.max_report_bytes, GRAPH: s.max_json_bytes, SIGNATURE: s.max_json_bytes}
        files: dict[str, Path] = {}
        infos: dict[str, ArtifactInfo] = {}
        report: ReportDocument | None = None
        for name, limit in limits.items():
            data = _read_regular(produced / name, limit, whole=True)
            if data is None:
                continue
            if name == REPORT:
                report = _validated(ReportDocument, name, data)
                continue
            _validated(GraphDocument if name == GRAPH else SignatureDocument, name, data)
            files[name] = produced / name
            if into is not None:
                files[name] = into / name
                files[name].write_bytes(data)
                infos[name] = ArtifactInfo(
                    name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()
                )
        if into is None:
            head = _read_regular(program, s.max_program_bytes, whole=False)
            if head is not None:
                if not head.startswith(_ZIP_MAGIC):
                    raise _Untrusted("program.pt2 is not a zip archive")
                files[PROGRAM] = program
        else:
            copied = _copy_regular(program, into / PROGRAM, s.max_program_bytes)
            if copied is not None:
                if copied.size > s.early_copy_bytes:  # it grew while being copied
                    shutil.rmtree(into, ignore_errors=True)
                    return None
                files[PROGRAM], infos[PROGRAM] = into / PROGRAM, copied
        if report is None:
            raise _Untrusted("no report.json")
        if report.status == "failed":
            return _Accepted(report, {}, {}, into)
        if set(files) != {PROGRAM, GRAPH, SIGNATURE}:
            raise _Untrusted("a succeeded job must produce program.pt2, graph.json, signature.json")
        return _Accepted(report, files, infos, into)

    def _run_unsandboxed(
        self,
        job: SandboxJob,
        options: ExportOptions,
        on_progress: ProgressCallback | None,
        started: float,
    ) -> SandboxResult:
        from engine import pipeline
        from engine.model import Upload

        work = Path(tempfile.mkdtemp(prefix="torchport-job-"))
        try:
            result = pipeline.run_export(
                pipeline.ExportRequest(
                    upload=Upload(model=job.model, inputs=job.inputs, weights=job.weights),
                    options=options,
                    out_dir=job.job_dir / "out",
                    work_dir=work,
                ),
                progress=on_progress,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report = result.report
        report.sandbox = SandboxReport(layers=["none"], details={"warning": "sandbox disabled"})
        report_path = job.job_dir / "out" / REPORT
        report_path.write_text(report.model_dump_json(indent=2))
        artifacts = {**result.artifacts, REPORT: report_path}
        return SandboxResult(report=report, artifacts=artifacts, error=report.error)


Document = TypeVar("Document", bound=BaseModel)


class _Cleaner:
    """Deletes finished jobs' staging directories off the jobs' critical path: each is
    renamed into `trash` (the job's processes are all gone by then) and deleted by one
    background thread. Deleting one took 1-15 ms here (ext4 with online discard).
    Whatever a crashed worker left in `trash` is deleted when the next one starts."""

    def __init__(self, trash: Path) -> None:
        shutil.rmtree(trash, ignore_errors=True)
        trash.mkdir(mode=0o700, parents=True)
        self.trash = trash
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sandbox-cleaner", daemon=True)
        self._thread.start()

    def remove(self, directory: Path) -> None:
        target = self.trash / directory.name
        try:
            os.rename(directory, target)
        except FileNotFoundError:
            return
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            return
        with self._idle:
            self._pending += 1
        self._queue.put(target)

    def flush(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (directory := self._queue.get()) is not None:
            shutil.rmtree(directory, ignore_errors=True)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


class _Untrusted(ValueError):
    """A job's output failed validation."""


_IN_FORCE = {"uid", "no_new_privs", "landlock_abi", "seccomp", "gpu"}
_REFUSAL_CODES = {"sandbox_violation", "invalid_request", "out_of_memory"}


class _CappedLog:
    """The job's stdout/stderr: the first `limit` bytes on disk, the last few kept."""

    def __init__(self, path: Path, limit: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("wb")
        self.left = limit
        self.last: collections.deque[bytes] = collections.deque()
        self.last_size = 0
        self.dropped = 0

    def write(self, data: bytes) -> None:
        if self.left > 0:
            self.file.write(data[: self.left])
            self.left -= min(len(data), self.left)
        else:
            self.dropped += len(data)
        self.last.append(data[-TAIL_BYTES:])
        self.last_size += len(self.last[-1])
        while self.last_size - len(self.last[0]) >= TAIL_BYTES:
            self.last_size -= len(self.last.popleft())

    def tail(self) -> str:
        text = b"".join(self.last)[-TAIL_BYTES:].decode(errors="replace")
        return text if not self.dropped else f"[{self.dropped} bytes not kept]\n{text}"

    def close(self) -> None:
        self.file.close()


def _error_for(
    verdict: str | None,
    exit_info: dict[str, Any],
    watch: _Watch,
    timeout: float,
    memory_mb: int,
) -> ErrorBody | None:
    if verdict == "timeout":
        return ErrorBody(
            code="timeout",
            message=f"The job ran longer than its time limit of {timeout:g} s and was stopped.",
            hint="Raise `timeout_s`, or export a smaller configuration of the model.",
            details={"timeout_s": timeout},
        )
    if verdict == "out_of_memory":
        return _out_of_memory(memory_mb)
    if verdict == "canceled":
        return ErrorBody(code="canceled", message="The job was canceled.")
    if verdict == "zygote_died":
        return ErrorBody(
            code="internal_error",
            message="The sandbox process died while the job ran; it has been restarted.",
            hint="This is a bug in torchport, not in your model; please report it.",
        )
    if watch.refused is not None:
        code, message = watch.refused
        if code == "out_of_memory":
            return _out_of_memory(memory_mb)
        if code == "sandbox_violation":
            message = f"The sandbox could not be set up, so the job was not run: {message}"
        return ErrorBody.model_validate({"code": code, "message": message})
    signum = exit_info.get("signal")
    if signum == signal.SIGXCPU:
        return ErrorBody(
            code="timeout",
            message="The job used up its CPU time limit and was stopped.",
            hint="Raise `timeout_s`, or export a smaller configuration of the model.",
        )
    if signum == signal.SIGSYS:
        return ErrorBody(
            code="sandbox_violation",
            message="The uploaded code made a system call the sandbox forbids.",
            hint="Uploaded code may not use the network, start processes or leave its directory.",
        )
    if signum == signal.SIGKILL:
        return _out_of_memory(memory_mb)  # nobody else kills a job: the kernel's OOM killer
    if signum is not None:
        return ErrorBody(
            code="internal_error",
            message=f"The job's process crashed ({signal.Signals(signum).name}).",
            hint="A crash in native code; if your model uses none, please report it.",
        )
    if watch.lockdown is None:
        return ErrorBody(
            code="sandbox_violation",
            message="The sandbox could not be set up, so the job was not run.",
            details={"exit": exit_info},
        )
    return None


def _out_of_memory(memory_mb: int) -> ErrorBody:
    return ErrorBody(
        code="out_of_memory",
        message=f"The job used more than its memory limit of {memory_mb} MB and was stopped.",
        hint="Raise `memory_mb`, or use smaller example inputs.",
        details={"memory_mb": memory_mb},
    )


def _failed_report(error: ErrorBody, duration: float) -> ReportDocument:
    return ReportDocument(
        status="failed", error=error, environment=_environment(), duration_s=duration
    )


def _environment() -> Environment:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return Environment(
        torchport=version("torchport") or "unknown",
        torch=version("torch"),
        python=platform.python_version(),
        platform=platform.platform(),
    )


def _open_regular(path: Path, limit: int) -> BinaryIO | None:
    """A file a job wrote, open for reading: a regular file (no links), at most `limit`
    bytes when opened; None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Untrusted(f"{path.name} cannot be opened safely ({exc.strerror})") from exc
    handle = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        handle.close()
        raise _Untrusted(f"{path.name} is not a regular file")
    if info.st_size > limit:
        handle.close()
        raise _Untrusted(f"{path.name} is larger than {limit} bytes")
    return handle


def _read_regular(path: Path, limit: int, *, whole: bool) -> bytes | None:
    """A file a job wrote (see `_open_regular`): all of it, or its first 4 bytes."""
    handle = _open_regular(path, limit)
    if handle is None:
        return None
    with handle:
        return handle.read(limit if whole else 4)


def _validated(document: type[Document], name: str, data: bytes) -> Document:
    """A result document the job wrote, or `_Untrusted` saying where it is wrong."""
    try:
        return document.model_validate_json(data)
    except ValidationError as exc:
        where = ", ".join(".".join(map(str, e["loc"])) or "(top)" for e in exc.errors()[:3])
        raise _Untrusted(f"{name} does not match its schema (at {where})") from None


def _copy_regular(path: Path, target: Path, limit: int) -> ArtifactInfo | None:
    """Copy a zip archive a job wrote (see `_open_regular`) to `target`, hashing what is
    copied and stopping at `limit` bytes; None when there is no such file."""
    source = _open_regular(path, limit)
    if source is None:
        return None
    digest, size = hashlib.sha256(), 0
    with source, target.open("xb") as copy:
        while chunk := source.read(1 << 20):
            if size == 0 and not chunk.startswith(_ZIP_MAGIC):
                raise _Untrusted(f"{path.name} is not a zip archive")
            size += len(chunk)
            if size > limit:  # it grew while being read
                raise _Untrusted(f"{path.name} is larger than {limit} bytes")
            digest.update(chunk)
            copy.write(chunk)
    if size == 0:
        raise _Untrusted(f"{path.name} is not a zip archive")
    return ArtifactInfo(name=path.name, size=size, sha256=digest.hexdigest())


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(x) for x in handle.read().split()]
    except OSError:
        return []


def _find_child(parent: int, inner: int) -> int | None:
    for pid in _children(parent):
        if _nspid(pid)[-1:] == [inner]:
            return pid
    return None


def _outer_pid(root: int, inner: int) -> int | None:
    """The pid, as seen here, of the descendant of `root` whose innermost pid is `inner`."""
    todo = [root]
    while todo:
        pid = todo.pop()
        ns = _nspid(pid)
        if ns and ns[-1] == inner and (len(ns) > 1 or pid == inner):
            return pid
        todo.extend(_children(pid))
    return None


def _zygote_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The zygote starts with nothing of the worker's environment (no secrets); a GPU
    worker's zygote also gets the GPU pinning from its settings (`GpuAccess.environment`).

    GOMP_SPINCOUNT: libgomp (torch's OpenMP) reads it once, when the zygote imports
    torch, so every child inherits it. Its default keeps idle worker threads spinning
    for ~300,000 pauses after each parallel region, taking a core from the other
    process of the job: the job child and its loader run side by side during the round
    trip. 10,000 keeps a short spin between back-to-back regions. Measured on the
    transformer block at an idle worker (18 paired runs): -37 ms median per job."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "GOMP_SPINCOUNT": "10000",
        **(extra or {}),
    }
