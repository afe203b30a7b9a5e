"""The worker's end of the zygote: how it is started (command line, scrubbed
environment, first `config` message), its control socket, and the thread that reads
the zygote's messages and hands each job's to that job's watch (supervisor.py).

Messages go by protocol.py; the zygote's side is zygote.py.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.sandbox import protocol
from worker.sandbox.confinement import bubblewrap, layers, lockdown
from worker.sandbox.confinement.gpu import GpuAccess
from worker.sandbox.processes import find_child, find_outer_pid
from worker.sandbox.settings import SandboxSettings

if TYPE_CHECKING:
    from worker.sandbox.host.watch import Watch

__all__ = [
    "SandboxUnavailable",
    "ZygoteClient",
    "build_argv",
    "build_config",
    "make_environment",
]


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot start on this host with these settings."""


class ZygoteClient:
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
                env=make_environment(env),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                cwd="/",
            )
        theirs.close()
        self.lock = threading.Lock()
        self.watches: dict[str, Watch] = {}
        self.alive = True
        self.jobs = itertools.count(1)
        """Numbers the jobs this zygote is handed (reported as `zygote_job`)."""
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
        self.outer_pid = find_outer_pid(self.proc.pid, int(self.info["pid"]))

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

    def send_job(
        self,
        job_id: str,
        staging: Path,
        limits: dict[str, Any],
        gpu: bool,
        fds: list[int],
    ) -> None:
        """Hand the zygote a staged job (`run`) with its progress and output pipes' write
        ends; OSError when the zygote is gone. The message names the job's directories
        and limits, nothing of its upload: the child reads its spec from its staging
        root (`protocol.JOB_SPEC`)."""
        dirs = {name: str(staging / name) for name in ("in", "out", "tmp")}
        dirs["root"] = str(staging)
        self.send(
            {"op": "run", "id": job_id, "dirs": dirs, "limits": limits, "gpu": gpu},
            fds,
        )

    def inner_to_outer(self, inner: int) -> int | None:
        """The worker-side pid of a zygote child (they differ inside bwrap's pid namespace)."""
        if self.outer_pid is None:
            return None
        if self.outer_pid == int(self.info["pid"]):
            return inner
        return find_child(self.outer_pid, inner)

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

    def wait_for_spares(self, timeout: float) -> bool:
        """Wait until a spare of every kind is ready; False when spares are off or did
        not get ready in time."""
        if not self.info.get("spares"):
            return False
        wanted = set(protocol.SPARE_KINDS)
        with self.spares:
            return self.spares.wait_for(
                lambda: wanted <= set(self.spares_ready) or not self.alive, timeout
            ) and wanted <= set(self.spares_ready)

    def read_learned_pages(self) -> dict[str, dict[str, int]]:
        """Per spare kind, the pages its first warm-up touched (as last told)."""
        with self.spares:
            return dict(self.learned_pages)

    def stop(self) -> None:
        self.alive = False
        # shutdown, not only close: the reader thread's recv holds the socket open, so a
        # close alone sent the zygote no EOF and every stop waited out the 2 s below.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        # On EOF the zygote kills its children itself; give it a moment, then insist.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def build_argv(
    python: str,
    bwrap: str | None,
    *,
    jobs_root: Path,
    tmpfs_mb: int,
    gpu: GpuAccess | None,
    cgroups: list[Path],
) -> list[str]:
    """The zygote's command line (the control socket's fd is appended at the start):
    this interpreter in isolated mode, inside bubblewrap where the host has it."""
    import worker

    root = str(Path(worker.__file__).resolve().parent.parent)
    boot = f"import sys; sys.path.insert(0, {root!r}); "
    boot += "from worker.sandbox.zygote.server import main; main()"
    argv = [python, "-I", "-c", boot]
    if bwrap is not None:
        prefix = bubblewrap.command(
            bwrap,
            lockdown.code_paths(),
            jobs_root=jobs_root,
            tmpfs_mb=tmpfs_mb,
            gpu=gpu,
            cgroups=cgroups,
        )
        argv = [*prefix, *argv]
    return argv


def build_config(
    settings: SandboxSettings,
    host: layers.HostLayers,
    jobs_root: Path,
    *,
    bwrap: str | None,
    gpu: GpuAccess | None,
) -> dict[str, Any]:
    """The zygote's `config` message: what it confines its children with."""
    ids = settings.job_ids()
    return {
        "read_paths": [str(p) for p in lockdown.code_paths()],
        "uid": ids[0] if ids else None,
        "gid": ids[1] if ids else None,
        "landlock": host.landlock_abi > 0,
        "warm_up": settings.warm_up,
        "spares": settings.spares,
        "warm_libraries": settings.warm_libraries,
        "warm_dir": str(jobs_root / ".warm"),
        "jobs_root": str(jobs_root),
        # Without bubblewrap, a root zygote builds its own view in which jobs reach
        # code under directories their uid cannot traverse (mountview.py).
        "mount_view": bwrap is None and ids is not None,
        "gpu": gpu.to_json() if gpu is not None else None,
    }


def make_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The zygote starts with nothing of the worker's environment (no secrets); a GPU
    worker's zygote also gets the GPU pinning from its settings (`GpuAccess.environment`).

    GOMP_SPINCOUNT: libgomp (torch's OpenMP) reads it once, when the zygote imports
    torch, so every child inherits it. Its default keeps idle worker threads spinning
    for ~300,000 pauses after each parallel region, taking a core from the other
    process of the job: the job child and its loader run side by side during the round
    trip. 1,000 keeps a short spin between back-to-back regions. A job's
    OpenMP thread that the scheduler put on its main thread's core (it does while the
    other core is busy: the zygote forking a successor spare, which then faults in its
    pages) waits out the whole spin before the other can run: `perf sched` showed the
    two threads taking turns on one core every ~0.25 ms at 10,000 while the other core
    idled, a transformer block's forward taking 8 ms instead of 0.7 ms for ~50 ms; at
    1,000 it takes ~2.2 ms then. Uncontended, 1,000 and 10,000 run the same (0.65 ms
    per forward, 0.96 ms at 300). See docs/sandbox.md."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "GOMP_SPINCOUNT": "1000",
        **(extra or {}),
    }
