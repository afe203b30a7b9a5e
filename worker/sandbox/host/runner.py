"""The worker side of the sandbox: `SandboxRunner` starts the zygote, stages each job,
hands it to the zygote and supervises it, and turns what came back into the job's
result. No process here ever imports the user's code, unpickles a job's output or
calls `torch.export.load`: the save → load round trip runs in a second sandboxed child.

The rooms: zygote_client.py (starting the zygote, its control socket), staging.py (a
job's directory, made and removed), supervisor.py (time, memory, disk, cancel),
pipes.py (progress lines and output), outputs.py (reading what a job wrote as
untrusted data), results.py (errors and the report), processes.py (/proc).
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from schemas import ExportOptions
from worker.sandbox.confinement import cgroups, converters, gpu, layers, lockdown
from worker.sandbox.confinement.gpu import GpuAccess
from worker.sandbox.host import outputs, pipes, results, supervisor
from worker.sandbox.host.exiting import Exiting
from worker.sandbox.host.job_resources import JobResources
from worker.sandbox.host.pipes import ProgressCallback
from worker.sandbox.host.slots import Slot
from worker.sandbox.host.staging import Cleaner, stage
from worker.sandbox.host.zygote_client import (
    SandboxUnavailable,
    ZygoteClient,
    build_argv,
    build_config,
)
from worker.sandbox.processes import list_children
from worker.sandbox.settings import SandboxJob, SandboxResult, SandboxSettings

__all__ = ["ProgressCallback", "SandboxRunner", "SandboxUnavailable"]


class SandboxRunner:
    """Runs exports in sandboxed children forked from a warm zygote.

    Use as a context manager, or call `start()` and `close()`. `run` is safe to call
    from several threads at once.
    """

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self._zygote: ZygoteClient | None = None
        self._host: layers.HostLayers | None = None
        self._bwrap: str | None = None
        self._lock = threading.Lock()
        self._owned_root: Path | None = None
        self._counter = itertools.count()
        self._resources = JobResources(self.settings)
        """Slots (each with its own uid), cgroups and the trees of the jobs running now."""
        self._gpu: GpuAccess | None = None
        self._cleaner: Cleaner | None = None
        self._exiting = Exiting()
        """Jobs whose result is out, waited for until their processes are gone."""
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
        self._cleaner = Cleaner(self.work_root / "trash")
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
        try:
            self._resources.open(self.work_root)
        except OSError as exc:
            raise SandboxUnavailable(f"job slots cannot be leased: {exc}") from exc
        self._spawn()
        return self

    def close(self) -> None:
        """Stop the zygote (killing any job still running) and remove owned files."""
        self._exiting.join(self.settings.kill_grace_s)
        with self._lock:
            if self._zygote is not None:
                self._zygote.stop()
                self._zygote = None
        if self._cleaner is not None:
            self._cleaner.close()
            self._cleaner = None
        self._resources.close()
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
        deadline = time.monotonic() + timeout
        self._exiting.join(timeout)
        zygote = self._zygote
        return zygote is not None and zygote.wait_for_spares(max(0.0, deadline - time.monotonic()))

    def learned_pages(self) -> dict[str, dict[str, int]]:
        """Per spare kind, the pages (write, read) its first warm-up touched, which later
        spares and fresh forks fault in ahead of their work; empty until learned."""
        zygote = self._zygote
        return zygote.read_learned_pages() if zygote is not None else {}

    def zygote_children(self) -> list[int]:
        """The zygote's live children as this process sees them (its spares, while no job
        runs); empty without a zygote."""
        pid = self.zygote_pid
        return list_children(pid) if pid is not None else []

    @property
    def zygote_hello(self) -> dict[str, Any]:
        """What the zygote said when it started (its size, warm-up time, libraries)."""
        zygote = self._zygote
        return dict(zygote.info) if zygote is not None else {}

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
        argv = build_argv(
            self._python(),
            self._bwrap,
            jobs_root=self.jobs_root,
            tmpfs_mb=self.settings.tmpfs_mb,
            gpu=self._gpu,
            cgroups=[group.parent for group in self._resources.groups],
        )
        config = build_config(
            self.settings, self._host, self.jobs_root, bwrap=self._bwrap, gpu=self._gpu
        )
        self._zygote = ZygoteClient(
            argv,
            config,
            self.work_root / "zygote.log",
            self.settings.start_timeout_s,
            env=self._gpu.environment if self._gpu is not None else None,
        )

    def _live_zygote(self) -> ZygoteClient:
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
        options = job.options  # typed and validated where the job came from (SandboxJob)
        if not self.settings.enabled:
            return results.run_unconfined(job, options, on_progress)
        job_id = f"{os.getpid()}-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        staging = self.jobs_root / job_id
        slot = self._resources.take_slot()
        ids = self.settings.job_ids(slot.number)
        exited: Callable[[], None] | None = None
        try:
            options, sized = stage(  # memory and disk sized from the uploads
                job,
                staging,
                ids,
                supervisor.job_timeout(options, self.settings),
                functools.partial(supervisor.sized, options, settings=self.settings),
            )
            result, exited = self._run_staged(
                job,
                options,
                sized or self.settings,
                job_id,
                staging,
                on_progress,
                cancel,
                started,
                ids,
            )
            return result
        finally:
            if exited is None:
                self._release(job_id, slot, staging)
            else:  # its processes are being killed: slot, groups and files once gone
                release = functools.partial(self._release, job_id, slot, staging)
                self._exiting.wait_then(exited, release, f"sandbox-exit-{job_id}")

    def _release(self, job_id: str, slot: Slot, staging: Path) -> None:
        self._resources.release(job_id, slot)  # once nothing of the job is left
        if (cleaner := self._cleaner) is not None:  # a job still exiting at close: None
            cleaner.remove(staging)
        else:
            shutil.rmtree(staging, ignore_errors=True)

    def wait_for_cleanup(self, timeout: float) -> bool:
        """Wait until the staging directories of finished jobs are deleted (that happens
        in the background, after `run` returned); False if not within `timeout`."""
        deadline = time.monotonic() + timeout
        if not self._exiting.join(timeout):
            return False
        return self._cleaner is None or self._cleaner.flush(max(0.0, deadline - time.monotonic()))

    def is_gpu_job(self, options: ExportOptions) -> bool:
        """Whether a job gets the GPU confinement: a CUDA job on a GPU worker. A CUDA job
        on a CPU worker keeps the CPU confinement and finds no GPU (`invalid_request`)."""
        return self._gpu is not None and options.device == "cuda"

    def _run_staged(
        self,
        job: SandboxJob,
        options: ExportOptions,
        settings: SandboxSettings,
        job_id: str,
        staging: Path,
        on_progress: ProgressCallback | None,
        cancel: threading.Event | None,
        started: float,
        ids: tuple[int, int] | None,
    ) -> tuple[SandboxResult, Callable[[], None] | None]:
        """The job's result, and when it came before the job's exit, what waits for that."""
        zygote = self._live_zygote()
        zygote_job = next(zygote.jobs)
        baseline_mb = int(zygote.info.get("data_mb", 0))
        gpu_job = self.is_gpu_job(options)
        model = job.uploads().get("model")
        staged_model = staging / "in" / model.name if model is not None else None
        limits, timeout, memory_mb = supervisor.job_limits(
            options,
            settings,
            baseline_mb,
            gpu_job,
            mapped_bytes=staged_model.stat().st_size if staged_model is not None else 0,
        )
        if ids is not None:  # the job's own uid (Zygote.confinement takes it out again)
            limits["uid"], limits["gid"] = ids
        executables = converters.programs(options.targets)
        if executables:  # the toolchain children's profile (toolchain.py; never the job's)
            limits["executables"] = [str(path) for path in executables]
            limits["toolchain"] = converters.toolchain(options.targets)
        rss_margin = settings.gpu_rss_margin_mb if gpu_job else 0
        memory_bytes = (memory_mb + int(zygote.info.get("rss_mb", 0)) + rss_margin) << 20
        groups = self._resources.groups_for(job_id, memory_bytes)
        if groups:
            limits["cgroups"] = [str(group) for group in groups.values()]
        group = groups.get("pids") or groups.get("memory")
        watch = supervisor.Watch()
        watch.tree.group, watch.tree.anchor = group, zygote.outer_pid
        self._resources.track(job_id, watch.tree)
        zygote.watches[job_id] = watch
        progress_r, progress_w = os.pipe2(os.O_CLOEXEC)
        output_r, output_w = os.pipe2(os.O_CLOEXEC)
        log = pipes.CappedLog(job.job_dir / pipes.LOG, settings.max_log_bytes)
        reader = threading.Thread(
            target=pipes.drain,
            args=(progress_r, output_r, watch, log, on_progress, settings.max_progress_line),
            name=f"sandbox-job-{job_id}",
            daemon=True,
        )
        reader.start()
        try:
            zygote.send_job(job_id, staging, limits, gpu_job, [progress_w, output_w])
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
            except (outputs.Untrusted, OSError):
                shutil.rmtree(accepted_dir, ignore_errors=True)  # read again after the exit

        verdict, exit_info = supervisor.supervise(
            zygote,
            job_id,
            watch,
            timeout,
            memory_bytes,
            cancel,
            staging,
            settings,
            accept_early,
        )

        def gone() -> None:  # no process of the job is left: nor are its pipes' writers
            zygote.watches.pop(job_id, None)
            reader.join(timeout=settings.kill_grace_s)
            log.close()

        after_done = bool(exit_info.get("after_done"))  # stopped, not yet gone
        if not after_done:
            gone()
        else:  # what it printed before `done` is in the log (pipes.drain): on disk now
            log.flush()
        # What it left behind counts too: a job may fill its quota between two checks and
        # exit before the next.
        if verdict is None and supervisor.measure_disk(staging, [], watch, settings):
            verdict = "disk_quota_exceeded"
        if verdict is None and "memory" in groups and cgroups.oom_kills(groups["memory"]):
            verdict = "out_of_memory"  # the kernel killed a process of the job's tree
        error = results.map_error(verdict, exit_info, watch, timeout, memory_mb, settings)
        details: dict[str, Any] = {
            "in_force": watch.lockdown or {},
            "spare": watch.spare,
            "prefault": watch.prefault,
            "roundtrips": watch.roundtrips,
            "exit": exit_info,
            "zygote_restarts": self.restarts,
            "zygote_job": zygote_job,
            "disk": results.describe_disk(watch.disk, settings),
            "memory": results.describe_memory(memory_bytes, watch, group, "memory" in groups),
        }
        if zygote.info.get("mount_view"):
            details["mount_view"] = zygote.info["mount_view"]
        details["warm_libraries"] = (zygote.info.get("libraries") or {}).get("imported", [])
        note = self.landlock_note()
        if note is not None:
            details["landlock"] = note
        result = results.finish(
            job,
            staging / "out",
            error,
            log.tail(),
            started,
            details,
            settings,
            bwrap=self._bwrap is not None,
            watch=watch,
            timed_out=verdict == "timeout",
        )

        def exited() -> None:
            supervisor.await_exit(zygote, job_id, watch, settings)
            gone()

        return result, (exited if after_done else None)

    def _take_outputs(self, produced: Path, into: Path | None = None) -> outputs.Accepted | None:
        """A job's outputs, checked as untrusted data (`outputs.take_outputs`)."""
        return outputs.take_outputs(produced, self.settings, into)
