"""The GPU worker's confinement: what a `device: "cuda"` job may use beyond a CPU job, and
that a CPU job (and a CPU worker) gets exactly what it got before.

No GPU here: device nodes are faked with `os.mknod` (char device 1:3, the null driver),
sysfs with a directory tree, and a CUDA job's child reports what it sees after lockdown
(`report.sandbox.details.in_force.gpu`). The `cuda` test runs a real export on a GPU.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import termios
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas import ExportOptions
from worker.sandbox import (
    SandboxJob,
    SandboxRunner,
    SandboxSettings,
    SandboxUnavailable,
    local_settings,
)
from worker.sandbox.confinement import bubblewrap, gpu, landlock, layers, lockdown, seccomp
from worker.sandbox.confinement.gpu import GpuAccess
from worker.sandbox.confinement.lockdown import Confinement, Limits

CANARY_NAME = "TORCHPORT_TEST_GPU_CANARY"
JOB_ENV = {"PATH", "HOME", "LANG", "TMPDIR", "USER", "LOGNAME", "OMP_NUM_THREADS", "PYTHONHASHSEED"}
GPU_ENV = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_CACHE_PATH"}
NODE_NAMES = ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
GVISOR_VERSION = "#1 SMP Sun Jan 10 15:06:54 PST 2016"

ENV_MODEL = """
import json, os
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1

model = Model()
example_args = (torch.ones(2),)
raise RuntimeError("ENV" + json.dumps(dict(os.environ)) + "ENV")
"""

TINY_MODEL = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
example_args = (torch.randn(2, 8),)
"""


def _fake_dev(root: Path) -> list[Path]:
    """NVIDIA-named char devices (the null driver) plus decoys that must not be listed."""
    root.mkdir(parents=True, exist_ok=True)
    null = os.makedev(1, 3)
    for name in [*NODE_NAMES, "nvidiafoo", "sda"]:
        os.mknod(root / name, 0o666 | stat.S_IFCHR, null)
        os.chmod(root / name, 0o666)  # past the umask: the job uid opens it read-write
    (root / "nvidia2").write_text("a regular file, not a device")
    (root / "nvidia-caps").mkdir()
    return sorted([root / name for name in NODE_NAMES] + [root / "nvidia-caps"])


def _fake_sys(root: Path) -> Path:
    """A sysfs with one NVIDIA and one Intel PCI function; returns the NVIDIA one's dir."""
    functions = root / "devices" / "pci0000:00"
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for address, vendor in (("0000:00:05.0", "0x10de"), ("0000:00:02.0", "0x8086")):
        (functions / address).mkdir(parents=True)
        (functions / address / "vendor").write_text(vendor + "\n")
        (links / address).symlink_to(Path("../../../devices/pci0000:00") / address)
    (root / "devices" / "system" / "node").mkdir(parents=True)
    return (functions / "0000:00:05.0").resolve()


# -- what a GPU job may use -----------------------------------------------------------


def test_device_nodes_are_the_nvidia_character_devices(tmp_path: Path) -> None:
    expected = _fake_dev(tmp_path / "dev")
    assert gpu.device_nodes(tmp_path / "dev") == expected
    assert gpu.device_nodes(tmp_path / "missing") == []


def test_gpu_sysfs_entries_are_the_nvidia_pci_functions(tmp_path: Path) -> None:
    nvidia = _fake_sys(tmp_path / "sys")
    (tmp_path / "proc" / "driver" / "nvidia").mkdir(parents=True)
    assert gpu.pci_gpu_dirs(tmp_path / "sys") == [nvidia]
    paths = gpu.system_read_paths(tmp_path / "proc", tmp_path / "sys")
    assert paths == [
        tmp_path / "proc" / "driver" / "nvidia",
        tmp_path / "sys" / "bus" / "pci",
        tmp_path / "sys" / "devices" / "system" / "node",
        nvidia,
    ]


def test_driver_library_dirs_come_from_the_loader_cache(tmp_path: Path) -> None:
    real = tmp_path / "driver-550"
    real.mkdir()
    (real / "libcuda.so.550.54").write_bytes(b"")
    links = tmp_path / "lib"
    links.mkdir()
    (links / "libcuda.so.1").symlink_to(real / "libcuda.so.550.54")
    text = (
        "631 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibcuda.so.1 (libc6,x86-64) => {links}/libcuda.so.1\n"
        "\tlibcudart.so.12 (libc6,x86-64) => /opt/cuda/lib64/libcudart.so.12\n"
        "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n"
    )
    assert gpu.parse_ldconfig(text) == [links, real]
    assert gpu.parse_ldconfig("\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n") == []


def test_discover_opens_up_nothing_without_device_nodes(tmp_path: Path) -> None:
    nodes = _fake_dev(tmp_path / "dev")
    nvidia = _fake_sys(tmp_path / "sys")
    access = gpu.discover(
        cuda_visible_devices="1",
        nvidia_visible_devices="GPU-1234",
        library_dirs=[tmp_path / "driver"],
        device_root=tmp_path / "dev",
        proc_root=tmp_path / "proc",
        sys_root=tmp_path / "sys",
    )
    assert list(access.devices) == nodes
    assert nvidia in access.read_paths and tmp_path / "driver" in access.read_paths
    assert access.environment == {
        "CUDA_VISIBLE_DEVICES": "1",
        "NVIDIA_VISIBLE_DEVICES": "GPU-1234",
        "LD_LIBRARY_PATH": str(tmp_path / "driver"),
    }
    assert GpuAccess.from_json(json.loads(json.dumps(access.to_json()))) == access

    bare = gpu.discover(cuda_visible_devices="", device_root=tmp_path / "empty", sys_root=tmp_path)
    assert bare.devices == () and bare.read_paths == ()
    assert bare.environment == {"CUDA_VISIBLE_DEVICES": ""}  # "" hides every GPU: kept


def test_bwrap_binds_the_gpu_nodes_only_for_a_gpu_worker(tmp_path: Path) -> None:
    nodes = _fake_dev(tmp_path / "dev")
    nvidia = _fake_sys(tmp_path / "sys")
    access = GpuAccess(
        devices=tuple(nodes),
        read_paths=(Path("/proc/driver/nvidia"), Path("/proc/devices"), nvidia),
    )
    binds = lockdown.code_paths()
    cpu = bubblewrap.command("bwrap", binds, jobs_root=tmp_path / "jobs", tmpfs_mb=8)
    with_gpu = bubblewrap.command(
        "bwrap", binds, jobs_root=tmp_path / "jobs", tmpfs_mb=8, gpu=access
    )
    assert binds == lockdown.code_paths()  # the caller's list is not extended
    assert "--dev-bind-try" not in cpu and "--dev-bind" not in cpu
    assert not any("nvidia" in arg or str(tmp_path / "sys") in arg for arg in cpu)

    dev = with_gpu.index("--dev")
    triples = [with_gpu[i : i + 3] for i, arg in enumerate(with_gpu) if arg == "--dev-bind-try"]
    assert triples == [["--dev-bind-try", str(n), str(n)] for n in nodes]
    assert all(with_gpu.index("--dev-bind-try") > dev for _ in triples)
    proc_bind = with_gpu.index("/proc/driver/nvidia")
    assert with_gpu[proc_bind - 1] == "--ro-bind-try" and proc_bind > with_gpu.index("--proc")
    assert "/proc/devices" not in with_gpu  # the fresh /proc has it already
    assert with_gpu[with_gpu.index(str(nvidia)) - 1] == "--ro-bind-try"
    # Take the GPU's binds (and the parent dirs made for them) away: the CPU argv is left.
    gpu_paths = {str(n) for n in nodes} | {"/proc/driver/nvidia", str(nvidia)}
    rest, i = [], 0
    while i < len(with_gpu):
        arg = with_gpu[i]
        if arg in ("--dev-bind-try", "--ro-bind-try") and with_gpu[i + 1] in gpu_paths:
            i += 3
        elif arg == "--perms" and with_gpu[i + 3].startswith(str(tmp_path / "sys")):
            i += 4
        else:
            rest.append(arg)
            i += 1
    assert rest == cpu


def test_cpu_confinement_is_unchanged(tmp_path: Path) -> None:
    conf = Confinement(
        limits=Limits(memory_mb=1024, cpu_s=10, fsize_mb=8, nofile=64, nproc=64),
        read_paths=[Path("/usr")],
        write_paths=[tmp_path / "out"],
        scratch=tmp_path,
    )
    reads, writes, devices, ioctl = lockdown.landlock_rules(conf, 1234)
    assert reads == [Path("/usr"), Path("/proc/1234"), Path("/proc/cpuinfo")]
    assert writes == [tmp_path / "out"]
    assert devices == [Path("/dev/null"), Path("/dev/zero"), Path("/dev/urandom")]
    assert ioctl == []
    assert set(lockdown.environment(tmp_path)) == JOB_ENV
    assert seccomp.denied() == seccomp.DENIED and "memfd_create" in seccomp.DENIED
    gpu_allowed = {"memfd_create", "socket", "bind", "listen"}
    assert set(seccomp.DENIED) - set(seccomp.denied(gpu=True)) == gpu_allowed

    conf.gpu = GpuAccess(devices=(Path("/dev/nvidia0"),), read_paths=(Path("/proc/driver/nvidia"),))
    reads, writes, devices, ioctl = lockdown.landlock_rules(conf, 1234)
    assert Path("/proc/driver/nvidia") in reads
    assert ioctl == [Path("/dev/nvidia0")]
    assert Path("/dev/nvidia0") not in devices
    assert writes == [tmp_path / "out", Path("/proc/1234/task")]  # the driver names threads


# -- the lockdown, in real forked children --------------------------------------------


ANSWER_FD = 3


def _in_child(work: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """Run `work(answer_fd)` in a forked child and return its JSON answer (or the error it
    raised). A lockdown keeps the answer pipe as fd ANSWER_FD (`keep_fds`)."""
    seccomp.prepare()  # pyseccomp's library lookup spawns helpers: never after lockdown
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read)
            answer = work(write)
        except BaseException as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        for fd in (write, ANSWER_FD):
            try:
                os.write(fd, json.dumps(answer).encode())
                break
            except OSError:
                continue
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _probe_device(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        return {"open": exc.errno}
    try:
        fcntl.ioctl(fd, termios.TCGETS, bytes(64))
    except OSError as exc:
        return {"open": 0, "ioctl": exc.errno}
    finally:
        os.close(fd)
    return {"open": 0, "ioctl": 0}


def _sockets() -> dict[str, Any]:
    """What each kind of socket call answers (0 or the errno)."""

    def attempt(make: Callable[[], Any]) -> int:
        try:
            made = make()
        except OSError as exc:
            return exc.errno or -1
        for sock in made if isinstance(made, tuple) else (made,):
            sock.close()
        return 0

    def listening() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.bind("\0torchport-probe-" + str(os.getpid()))
        sock.listen(1)
        return sock

    def connecting() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect("\0torchport-probe-none")
        return sock

    return {
        "driver_kind": attempt(listening),
        "unix_stream": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
        "unix_dgram": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),
        "inet": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
        "inet_seqpacket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_SEQPACKET)),
        "netlink": attempt(
            lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC)
        ),
        "connect": attempt(connecting),
        "pair": attempt(lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)),
    }


def test_a_cuda_job_may_make_only_the_drivers_kind_of_socket() -> None:
    # The NVIDIA driver (580, CUDA 13) listens on an abstract AF_UNIX SOCK_SEQPACKET
    # socket while it initializes; error 304 without it (measured on an H100).
    def filtered(gpu: bool) -> dict[str, Any]:
        lockdown.prctl(lockdown.PR_SET_NO_NEW_PRIVS, 1)
        seccomp.install(os.getpid(), gpu=gpu)
        return _sockets()

    refused = {"unix_stream", "unix_dgram", "inet", "inet_seqpacket", "netlink", "pair"}
    gpu_job = _in_child(lambda _: filtered(gpu=True))
    assert gpu_job["driver_kind"] == 0
    assert {name: gpu_job[name] for name in refused} == dict.fromkeys(refused, errno.EPERM)
    assert gpu_job["connect"] == errno.EPERM  # the socket is made, connect is refused
    cpu_job = _in_child(lambda _: filtered(gpu=False))
    assert set(cpu_job.values()) == {errno.EPERM}
    assert _in_child(lambda _: _sockets())["driver_kind"] == 0  # unfiltered, it works


@pytest.mark.skipif(landlock.abi_version() < 5, reason="Landlock IOCTL_DEV needs ABI 5")
def test_landlock_allows_device_ioctls_only_on_the_gpu_nodes(tmp_path: Path) -> None:
    _fake_dev(tmp_path / "dev")
    node = tmp_path / "dev" / "nvidia0"

    def restricted(ioctl: bool) -> dict[str, Any]:
        lockdown.prctl(lockdown.PR_SET_NO_NEW_PRIVS, 1)
        if ioctl:
            landlock.restrict([], [], ioctl_devices=[node])
        else:
            landlock.restrict([], [], devices=[node])
        return _probe_device(node)

    # The null driver has no TCGETS: ENOTTY means the ioctl reached it.
    assert _in_child(lambda _: restricted(ioctl=True)) == {"open": 0, "ioctl": errno.ENOTTY}
    assert _in_child(lambda _: restricted(ioctl=False)) == {"open": 0, "ioctl": errno.EACCES}


def _locked_down_view(conf: Confinement, node: Path, answer_fd: int) -> dict[str, Any]:
    conf.keep_fds = {ANSWER_FD: answer_fd}
    in_force = lockdown.apply(conf)
    memfd: int | None = 0
    try:
        os.close(os.memfd_create("probe"))
    except OSError as exc:
        memfd = exc.errno
    return {
        "env": dict(os.environ),
        "in_force": in_force,
        "memfd": memfd,
        "device": _probe_device(node),
    }


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary dir the job uid can traverse (pytest's own are root-only)."""
    root = Path(tempfile.mkdtemp(prefix="torchport-gpu-test-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_gpu_child_gets_the_pinning_the_nodes_and_memfd_and_nothing_else(
    open_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CANARY_NAME, "secret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the worker's own env is never used
    nodes = _fake_dev(open_tmp / "dev")
    os.chmod(open_tmp / "dev", 0o755)
    node = open_tmp / "dev" / "nvidia0"
    scratch = open_tmp / "scratch"
    scratch.mkdir()
    os.chown(scratch, 65534, 65534)
    access = GpuAccess(
        devices=tuple(nodes),
        environment=gpu.environment("1", "all", [Path("/usr/lib/nvidia")]),
    )

    def conf(with_gpu: bool) -> Confinement:
        return Confinement(
            limits=Limits(memory_mb=1 << 20, cpu_s=60, fsize_mb=8, nofile=64, nproc=4096),
            read_paths=lockdown.code_paths(),
            write_paths=[scratch],
            scratch=scratch,
            uid=65534,
            gid=65534,
            landlock=landlock.abi_version() > 0,
            gpu=access if with_gpu else None,
        )

    seen = _in_child(lambda fd: _locked_down_view(conf(True), node, fd))
    assert "error" not in seen, seen
    assert set(seen["env"]) == JOB_ENV | GPU_ENV | {"LD_LIBRARY_PATH"}
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert seen["env"]["CUDA_CACHE_PATH"] == str(scratch / "cuda-cache")
    assert seen["env"]["LD_LIBRARY_PATH"] == "/usr/lib/nvidia"
    assert seen["in_force"]["gpu"]["cuda_visible_devices"] == "1"
    assert seen["in_force"]["gpu"]["device_nodes"] == len(nodes)
    assert seen["memfd"] == 0
    if landlock.abi_version() >= 5:
        assert seen["device"] == {"open": 0, "ioctl": errno.ENOTTY}

    cpu = _in_child(lambda fd: _locked_down_view(conf(False), node, fd))
    assert "error" not in cpu, cpu
    assert set(cpu["env"]) == JOB_ENV
    assert "gpu" not in cpu["in_force"]
    assert cpu["memfd"] == errno.EPERM
    if landlock.abi_version() > 0:
        assert cpu["device"] == {"open": errno.EACCES}


# -- gVisor ---------------------------------------------------------------------------


def test_gvisor_is_detected_only_by_its_own_markers() -> None:
    assert layers.detect_gvisor() is False  # this machine runs a Linux kernel

    def uname(release: str, version: str) -> os.uname_result:
        return os.uname_result(("Linux", "runsc", release, version, "x86_64"))

    assert layers.detect_gvisor(uname("4.4.0", GVISOR_VERSION), "") is True
    assert layers.detect_gvisor(uname("4.19.0-gvisor", GVISOR_VERSION), "") is True
    assert layers.detect_gvisor(uname("6.8.0", GVISOR_VERSION), "[0.0] Starting gVisor...") is True
    assert layers.detect_gvisor(uname("6.8.0", GVISOR_VERSION), "[0.0] Linux version 6.8") is False
    assert (
        layers.detect_gvisor(uname("4.4.0", "#1 SMP PREEMPT_DYNAMIC"), "Starting gVisor") is False
    )


def _host(abi: int, note: str | None, gvisor: bool) -> layers.HostLayers:
    notes = {"landlock": note} if note else {}
    return layers.HostLayers(abi, seccomp=True, bwrap=None, root=True, notes=notes, gvisor=gvisor)


def test_landlock_is_dropped_only_under_gvisor_or_when_allowed() -> None:
    runner = SandboxRunner(SandboxSettings())
    runner._host = _host(7, None, gvisor=False)
    assert runner.landlock_note() is None
    runner._host = _host(0, layers.LANDLOCK_GVISOR, gvisor=True)
    assert runner.landlock_note() == "unavailable (gvisor)"
    runner._host = _host(0, "unavailable (the kernel has no Landlock: ENOSYS)", gvisor=False)
    assert runner.landlock_note() is None  # start() refuses
    allowed = SandboxRunner(SandboxSettings(allow_without_landlock=True))
    allowed._host = runner._host
    note = allowed.landlock_note()
    assert note is not None and note.startswith("unavailable (the kernel has no Landlock")


def test_without_landlock_outside_gvisor_the_runner_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landlock, "probe", lambda: (0, errno.ENOSYS))
    monkeypatch.setattr(layers, "detect_gvisor", lambda: False)
    runner = SandboxRunner(SandboxSettings(work_root=tmp_path, use_bwrap=False, warm_up=False))
    with pytest.raises(SandboxUnavailable, match="Landlock"):
        runner.start()
    runner.close()


def test_under_gvisor_jobs_run_without_landlock_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landlock, "probe", lambda: (0, errno.ENOSYS))
    monkeypatch.setattr(layers, "detect_gvisor", lambda: True)
    model = tmp_path / "tiny.py"
    model.write_text(TINY_MODEL)
    settings = SandboxSettings(work_root=tmp_path / "work", warm_up=False)
    with SandboxRunner(settings) as runner:
        assert "landlock" not in runner.expected_layers()
        result = runner.run(
            SandboxJob(
                model=model,
                inputs=None,
                weights=None,
                options=ExportOptions(),
                job_dir=tmp_path / "j",
            )
        )
    assert result.report.status == "succeeded", result.error
    sandbox = result.report.sandbox
    assert sandbox is not None
    assert sandbox.details["landlock"] == "unavailable (gvisor)"
    assert "landlock" not in sandbox.layers and "seccomp" in sandbox.layers
    assert "landlock_abi" not in sandbox.details["in_force"]


# -- the zygote and the runner of a GPU worker ----------------------------------------


def test_cuda_hidden_keeps_torch_export_away_from_the_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    from worker.sandbox.zygote.warmup import cuda_hidden

    calls: list[str] = []
    real = torch.cuda.is_available

    def spy() -> bool:
        calls.append("asked")
        return bool(real())

    monkeypatch.setattr(torch.cuda, "is_available", spy)
    # A fake mode that sees no CUDA calls this, and on a CUDA build it asks the driver
    # for its device count (cuInit, a driver thread in the zygote): seen on an H100.
    real_guard = torch._C._ensureCUDADeviceGuardSet

    def guard_spy() -> None:
        calls.append("guard")
        real_guard()

    monkeypatch.setattr(torch._C, "_ensureCUDADeviceGuardSet", guard_spy)

    def export() -> None:
        module = torch.nn.Linear(2, 2)
        torch.export.export(module, (torch.zeros(1, 2),), strict=False).run_decompositions()

    with cuda_hidden(torch):
        assert torch.cuda.is_available() is False and torch.cuda.device_count() == 0
        export()
    assert calls == []
    export()  # without it, export does ask the driver (so the check above can fail)
    assert "asked" in calls
    assert torch.cuda.is_available is spy  # restored: the spy, not a stale function
    assert torch._C._ensureCUDADeviceGuardSet is guard_spy
    calls.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as the warm-up sees it
    with torch._subclasses.fake_tensor.FakeTensorMode():
        pass
    assert calls == ["guard"]  # so the check inside cuda_hidden can fail


@pytest.fixture(scope="module")
def gpu_runner() -> Iterator[SandboxRunner]:
    root = Path(tempfile.mkdtemp(prefix="torchport-gpu-"))
    os.environ[CANARY_NAME] = "canary-" + os.urandom(4).hex()
    settings = SandboxSettings(
        work_root=root / "work", gpu=True, cuda_visible_devices="0", nvidia_visible_devices="0"
    )
    runner = SandboxRunner(settings).start()
    try:
        yield runner
    finally:
        runner.close()
        os.environ.pop(CANARY_NAME, None)
        shutil.rmtree(root, ignore_errors=True)


def _run(runner: SandboxRunner, source: str, options: dict[str, Any]) -> Any:
    root = Path(tempfile.mkdtemp(prefix="torchport-gpu-job-"))
    os.chmod(root, 0o755)
    model = root / "model.py"
    model.write_text(source)
    try:
        return runner.run(
            SandboxJob(
                model=model,
                inputs=None,
                weights=None,
                options=ExportOptions.model_validate(options),
                job_dir=root / "j",
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_zygote_never_initializes_cuda(gpu_runner: SandboxRunner) -> None:
    zygote = gpu_runner._zygote
    assert zygote is not None
    assert zygote.info["cuda_initialized"] is False
    assert zygote.info["cuda_fork_poisoned"] is False
    with open(f"/proc/{gpu_runner.zygote_pid}/environ", "rb") as handle:
        env = dict(
            item.decode().split("=", 1) for item in handle.read().split(b"\0") if b"=" in item
        )
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert CANARY_NAME not in env


def test_a_cuda_job_child_runs_pinned_and_sees_nothing_else(gpu_runner: SandboxRunner) -> None:
    torch = pytest.importorskip("torch")
    result = _run(gpu_runner, TINY_MODEL, {"device": "cuda"})
    assert result.report.sandbox is not None
    seen = result.report.sandbox.details["in_force"]["gpu"]
    assert seen["cuda_visible_devices"] == "0"
    assert set(seen["environment"]) == JOB_ENV | GPU_ENV
    assert seen["device_nodes"] == len(gpu.device_nodes())
    if torch.cuda.is_available():
        assert result.report.status == "succeeded", result.error
    else:
        assert result.error is not None and result.error.code == "invalid_request"
        assert result.error.details == {"device": "cuda"}


def test_a_cpu_job_on_a_gpu_worker_keeps_the_cpu_confinement(gpu_runner: SandboxRunner) -> None:
    result = _run(gpu_runner, ENV_MODEL, {"device": "cpu"})
    assert result.error is not None
    text = result.error.message + str(result.error.details)
    found = re.search(r"ENV(\{.*?\})ENV", text)
    assert found is not None, result.error
    assert set(json.loads(found.group(1))) == JOB_ENV
    assert result.report.sandbox is not None
    assert "gpu" not in result.report.sandbox.details["in_force"]


@pytest.mark.cuda
def test_a_cuda_export_runs_on_the_gpu_through_the_sandbox(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    settings = SandboxSettings(
        work_root=tmp_path / "work",
        gpu=True,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    with SandboxRunner(settings) as runner:
        result = _run(runner, TINY_MODEL, {"device": "cuda"})
    report = result.report
    assert report.status == "succeeded", (result.error, result.stdout_tail)
    assert report.environment.device == "cuda"
    assert report.environment.gpu == torch.cuda.get_device_name(0)
    assert report.verification is not None and report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    assert report.verification.roundtrip.loader == "sandbox"
    assert report.sandbox is not None and "seccomp" in report.sandbox.layers


# -- how workers and the CLI ask for it -----------------------------------------------


def test_a_gpu_queue_worker_builds_a_gpu_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.sandbox
    from worker.execution import WorkerContext
    from worker.settings import WorkerSettings

    built: list[SandboxSettings] = []

    class FakeRunner:
        def __init__(self, settings: SandboxSettings) -> None:
            built.append(settings)

        def start(self) -> FakeRunner:
            return self

    monkeypatch.setattr(worker.sandbox, "SandboxRunner", FakeRunner)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("TORCHPORT_CUDA_VISIBLE_DEVICES", raising=False)
    for queues, expected in (("gpu", True), ("cpu", False), ("cpu,gpu", True)):
        context = WorkerContext(
            settings=WorkerSettings(queues=queues),
            engine=None,  # type: ignore[arg-type]
            sessions=None,  # type: ignore[arg-type]
            store=None,  # type: ignore[arg-type]
            identity="test",
        )
        context.runner()
        assert built[-1].gpu is expected
        assert built[-1].cuda_visible_devices == "1"


def test_the_cli_gives_only_cuda_jobs_a_gpu_runner() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "", CANARY_NAME: "x"}
    cuda = local_settings(ExportOptions(device="cuda"), environ)
    assert cuda.gpu is True and cuda.cuda_visible_devices == ""
    assert cuda.nvidia_visible_devices is None
    assert local_settings(ExportOptions(device="cpu"), environ) == SandboxSettings(
        spares=False, warm_up="during_first_job"
    )
    assert local_settings(ExportOptions(), environ).gpu is False
    assert cuda.spares is False  # one job per runner: a spare would only be killed unused
