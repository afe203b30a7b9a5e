"""Fixtures that make a sandbox escape observable.

A canary secret in the worker's environment and in a world-readable file, TCP,
UDP and Unix-socket listeners on loopback that record anything they receive, a
world-writable marker directory, a sibling job's directory with its own secret,
and hashes of installed code. Hostile models are templates under tests/models
(`hostile_*.py`) whose `TARGETS = {}` line is replaced with these addresses.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import worker.sandbox
from schemas import ExportOptions
from worker.sandbox import SandboxJob, SandboxResult, SandboxRunner, SandboxSettings
from worker.sandbox.confinement import landlock
from worker.sandbox.host.slots import SlotLeases

MODELS = Path(__file__).resolve().parents[1] / "models"
CANARY = "canary-" + os.urandom(8).hex()
SIBLING_CANARY = "sibling-" + os.urandom(8).hex()
JOB_UID = 65534
MARGIN_S = 4.0
SPARE_WAIT_S = 120.0


@dataclass
class Listeners:
    """Loopback listeners that count whatever reaches them."""

    tcp_port: int = 0
    udp_port: int = 0
    unix_path: str = ""
    received: list[str] = field(default_factory=list)
    _sockets: list[socket.socket] = field(default_factory=list)

    def start(self, directory: Path) -> None:
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(16)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix_path = str(directory / "listener.sock")
        unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        unix.listen(16)
        self.tcp_port, self.udp_port = tcp.getsockname()[1], udp.getsockname()[1]
        self._sockets = [tcp, udp, unix]
        for sock, kind in ((tcp, "tcp"), (unix, "unix")):
            threading.Thread(target=self._accept, args=(sock, kind), daemon=True).start()
        threading.Thread(target=self._receive, args=(udp,), daemon=True).start()

    def _accept(self, sock: socket.socket, kind: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.received.append(f"{kind} connection")
            conn.close()

    def _receive(self, sock: socket.socket) -> None:
        while True:
            try:
                data, _ = sock.recvfrom(65536)
            except OSError:
                return
            self.received.append(f"udp {data!r}")

    def stop(self) -> None:
        for sock in self._sockets:
            sock.close()


@dataclass
class Arena:
    """Everything a hostile job might reach, and the runner it runs under."""

    runner: SandboxRunner
    root: Path
    listeners: Listeners
    secret_file: Path
    marker_dir: Path
    sibling_dir: Path
    installed: dict[Path, str]
    zygote_pid: int
    spares: bool = False
    """Every job waits for the zygote's spares and must run in one (else: a fresh fork)."""

    def targets(self) -> dict[str, object]:
        return {
            "tcp_port": self.listeners.tcp_port,
            "udp_port": self.listeners.udp_port,
            "unix_path": self.listeners.unix_path,
            "secret_file": str(self.secret_file),
            "marker_dir": str(self.marker_dir),
            "worker_pid": os.getpid(),
            "jobs_root": str(self.runner.jobs_root),
            "sibling_dir": str(self.sibling_dir),
            "sibling_file": str(self.sibling_dir / "in" / "model.py"),
            "installed": [str(p) for p in self.installed],
            "readable_outside": str(self.sibling_dir / "in" / "model.py"),
        }

    def model(self, name: str) -> Path:
        """A hostile template with the targets filled in, as an upload."""
        text = (MODELS / f"hostile_{name}.py").read_text()
        text = text.replace("TARGETS = {}", "TARGETS = " + repr(self.targets()))
        upload_dir = Path(tempfile.mkdtemp(dir=self.root))
        path = upload_dir / f"{name}.py"
        path.write_text(text)
        return path

    def run(
        self,
        model: Path,
        *,
        options: dict[str, object] | None = None,
        inputs: Path | None = None,
    ) -> tuple[SandboxResult, float, Path]:
        job_dir = Path(tempfile.mkdtemp(dir=self.root))
        if self.spares:
            assert self.runner.wait_for_spares(SPARE_WAIT_S), "the spares did not get ready"
        started = time.monotonic()
        result = self.runner.run(
            SandboxJob(
                model=model,
                inputs=inputs,
                weights=None,
                options=ExportOptions.model_validate(options or {}),
                job_dir=job_dir,
            )
        )
        elapsed = time.monotonic() - started
        details = result.report.sandbox.details if result.report.sandbox else {}
        if "spare" in details:  # the job reached the sandbox
            assert details["spare"] is self.spares
        return result, elapsed, job_dir


def job_uids() -> set[int]:
    """The uids a root worker's jobs run as: slot 0's, or another slot's (a job still
    exiting holds its slot, so the next one, of this runner or another, may get slot 1)."""
    base = SandboxSettings().slot_uid_base
    return {JOB_UID, *range(base + 1, base + 64)}


def wait_for_first_slot(runner: SandboxRunner, timeout: float = 30) -> None:
    """Wait until no job of any runner on this machine holds slot 0 (a job still exiting
    holds its slot), so that the next job runs as slot 0's uid."""
    leases = runner._resources.leases
    if leases is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        slot = leases.take()
        SlotLeases.release(slot)
        if slot.number == 0:
            return
        assert time.monotonic() < deadline, "slot 0 stayed held"
        time.sleep(0.01)


def job_processes() -> list[int]:
    """Live processes running as a job's uid (`job_uids`)."""
    uids = job_uids()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                for line in handle:
                    if line.startswith("Uid:") and int(line.split()[1]) in uids:
                        found.append(int(entry))
        except OSError:
            continue
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def fresh_arena() -> Iterator[Arena]:
    """Jobs in fresh forks of the zygote (spares off)."""
    yield from _arena(spares=False)


@pytest.fixture
def arena(fresh_arena: Arena) -> Arena:
    return fresh_arena


@pytest.fixture(scope="session")
def spare_arena() -> Iterator[Arena]:
    """Jobs handed to the zygote's pre-forked, self-warmed spares."""
    yield from _arena(spares=True)


@pytest.fixture(params=["fresh", "spare"])
def each_arena(request: pytest.FixtureRequest) -> Arena:
    """Both ways a job child comes to be: the same tests must hold for each."""
    name = "fresh_arena" if request.param == "fresh" else "spare_arena"
    arena: Arena = request.getfixturevalue(name)
    return arena


def _arena(spares: bool) -> Iterator[Arena]:
    root = Path(tempfile.mkdtemp(prefix="torchport-hostile-"))
    os.chmod(root, 0o755)
    secret_file = root / "secret.txt"
    secret_file.write_text(CANARY)
    os.chmod(secret_file, 0o644)  # only the sandbox, not file modes, may keep it out
    marker_dir = root / "markers"
    marker_dir.mkdir()
    os.chmod(marker_dir, 0o777)
    listeners = Listeners()
    listen_dir = root / "listen"
    listen_dir.mkdir()
    os.chmod(listen_dir, 0o777)
    listeners.start(listen_dir)
    os.environ["TORCHPORT_TEST_CANARY"] = CANARY
    settings = SandboxSettings(
        work_root=root / "work", fsize_mb=64, max_log_bytes=256 << 10, spares=spares
    )
    runner = SandboxRunner(settings).start()
    sibling = runner.jobs_root / "other-job"
    (sibling / "in").mkdir(parents=True)
    (sibling / "in" / "model.py").write_text(SIBLING_CANARY)
    for path in (sibling, sibling / "in", sibling / "in" / "model.py"):
        os.chown(path, JOB_UID, JOB_UID)  # the same uid as every job: only Landlock stops it
    package = Path(worker.sandbox.__file__).resolve()
    installed = [package, Path(worker.sandbox.host.runner.__file__).resolve()]
    import engine

    installed.append(Path(engine.__file__).resolve())
    assert runner.zygote_pid is not None
    yield Arena(
        runner=runner,
        root=root,
        listeners=listeners,
        secret_file=secret_file,
        marker_dir=marker_dir,
        sibling_dir=sibling,
        installed={path: digest(path) for path in installed},
        zygote_pid=runner.zygote_pid,
        spares=spares,
    )
    runner.close()
    listeners.stop()
    os.environ.pop("TORCHPORT_TEST_CANARY", None)
    shutil.rmtree(root, ignore_errors=True)


def supported_layers() -> set[str]:
    """The layers this machine supports, probed independently of the runner."""
    from worker.sandbox.confinement import layers, lockdown

    host = layers.probe(lockdown.code_paths())
    found = {"zygote", "rlimits", "no_new_privs"}
    if host.seccomp:
        found.add("seccomp")
    if landlock.abi_version() > 0:
        found.add("landlock")
    if host.bwrap is not None:
        found.add("bwrap")
    if os.geteuid() == 0:
        found.add("uid")
    return found


def run_benign(runner: SandboxRunner, arena: Arena, name: str) -> SandboxResult:
    """The benign model run by `runner` (not the arena's own), whatever kind of child it
    gets, in `arena.root/<name>-<pid>`."""
    return runner.run(
        SandboxJob(
            model=arena.model("benign"),
            inputs=None,
            weights=None,
            options=ExportOptions(),
            job_dir=arena.root / f"{name}-{os.getpid()}",
        )
    )


def fresh_runner(**overrides: object) -> SandboxRunner:
    """A runner of its own (for settings the session runner does not have)."""
    return SandboxRunner(SandboxSettings(**overrides))  # type: ignore[arg-type]


def run_upload(runner: SandboxRunner, model: str, options: dict[str, object]) -> SandboxResult:
    """Run the upload `tests/models/<model>` with `options` (a 600 s timeout unless they
    say otherwise), staged beside the runner's work root where the job uid can read it."""
    assert runner.work_root is not None
    upload = Path(tempfile.mkdtemp(dir=runner.work_root.parent)) / model
    shutil.copyfile(MODELS / model, upload)
    os.chmod(upload.parent, 0o755)
    return runner.run(
        SandboxJob(
            model=upload,
            inputs=None,
            weights=None,
            options=ExportOptions.model_validate({"timeout_s": 600, **options}),
            job_dir=Path(tempfile.mkdtemp(dir=runner.work_root.parent)),
        )
    )
