"""What a CUDA job needs beyond a CPU job's confinement, found once by the worker.

A GPU worker (`SandboxSettings(gpu=True)`) gives its `device: "cuda"` jobs, and only
those, exactly this much more than a CPU job:

- the NVIDIA device nodes that exist (`/dev/nvidiactl`, `/dev/nvidia<N>`,
  `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`, `/dev/nvidia-caps/`)
  for read, write and ioctl (Landlock `IOCTL_DEV` on ABI 5+), bound into bubblewrap;
- read access to the driver's `/proc/driver/nvidia` and `/proc/devices`, the NVIDIA PCI
  functions' sysfs directories, `/sys/bus/pci`, the NUMA topology and the driver
  modules' parameters in sysfs, and the directories holding the driver's user-space
  libraries (`libcuda.so.1`, from `ldconfig -p`);
- an environment of `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` from the worker's
  settings (never from its environment), `CUDA_CACHE_PATH` in the job's scratch dir and,
  when configured, `LD_LIBRARY_PATH` of the driver library dirs;
- `memfd_create` (the driver creates memfds while it initializes; seccomp.py).

The roots are parameters so that tests can point them at a fake `/dev` and `/sys`.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NVIDIA_PCI_VENDOR = "0x10de"
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1")
"""The driver's user-space libraries a CUDA job loads (torch wheels bring the rest)."""

_DEVICE_NAME = re.compile(r"^nvidia(ctl|[0-9]+|-uvm|-uvm-tools|-modeset)$")
_CAPS_DIR = "nvidia-caps"  # MIG capability nodes (nvidia-cap<N>)
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


@dataclass(frozen=True)
class GpuAccess:
    """The extra confinement of a CUDA job; JSON-able, handed to the zygote."""

    devices: tuple[Path, ...] = ()
    """Device nodes (and the MIG caps dir) the job may open read-write and ioctl."""
    read_paths: tuple[Path, ...] = ()
    """procfs and sysfs entries of the driver and the GPUs, and the driver library dirs."""
    environment: dict[str, str] = field(default_factory=dict)
    """Variables added to the job's (and the zygote's) otherwise fixed environment."""

    def to_json(self) -> dict[str, Any]:
        """The form the zygote's `config` message carries."""
        return {
            "devices": [str(p) for p in self.devices],
            "read_paths": [str(p) for p in self.read_paths],
            "environment": dict(self.environment),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuAccess:
        """Inverse of `to_json`."""
        return cls(
            devices=tuple(Path(p) for p in data.get("devices", [])),
            read_paths=tuple(Path(p) for p in data.get("read_paths", [])),
            environment={str(k): str(v) for k, v in dict(data.get("environment", {})).items()},
        )


def device_nodes(device_root: Path = Path("/dev")) -> list[Path]:
    """The NVIDIA character devices under `device_root` (and its MIG caps dir)."""
    found: list[Path] = []
    try:
        entries = sorted(device_root.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            mode = entry.lstat().st_mode
        except OSError:
            continue
        node = _DEVICE_NAME.match(entry.name) is not None and stat.S_ISCHR(mode)
        caps = entry.name == _CAPS_DIR and stat.S_ISDIR(mode)
        if node or caps:
            found.append(entry)
    return found


def pci_gpu_dirs(sys_root: Path = Path("/sys")) -> list[Path]:
    """The sysfs directories of NVIDIA PCI functions, resolved (the
    `/sys/bus/pci/devices/*` links point into `/sys/devices/pci*`)."""
    found: list[Path] = []
    try:
        entries = sorted((sys_root / "bus" / "pci" / "devices").iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            vendor = (entry / "vendor").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR:
            found.append(entry.resolve())
    return found


def system_read_paths(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> list[Path]:
    """procfs and sysfs entries the CUDA driver reads, where they exist."""
    candidates = [
        proc_root / "driver" / "nvidia",
        proc_root / "devices",  # major numbers of nvidia and nvidia-uvm
        sys_root / "bus" / "pci",
        sys_root / "devices" / "system" / "node",  # NUMA topology (read by cuCtxCreate)
        sys_root / "module" / "nvidia",
        sys_root / "module" / "nvidia_uvm",
        *pci_gpu_dirs(sys_root),
    ]
    return [p for p in candidates if p.exists()]


def parse_ldconfig(text: str, names: tuple[str, ...] = DRIVER_LIBRARIES) -> list[Path]:
    """Directories (of the resolved files too) holding `names`, from `ldconfig -p` output."""
    dirs: list[Path] = []
    for line in text.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if match is None or match.group(1) not in names:
            continue
        path = Path(match.group(3))
        for directory in (path.parent, path.resolve().parent):
            if directory not in dirs:
                dirs.append(directory)
    return dirs


def driver_library_dirs() -> list[Path]:
    """Where this host's `ldconfig` cache finds the driver libraries ([] without one)."""
    exe = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if Path(p).exists()), None
    )
    if exe is None:
        return []
    try:
        done = subprocess.run(
            [exe, "-p"], capture_output=True, text=True, timeout=10, check=False, env={}
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [p for p in parse_ldconfig(done.stdout) if p.is_dir()]


def environment(
    cuda_visible_devices: str | None,
    nvidia_visible_devices: str | None,
    library_dirs: list[Path],
) -> dict[str, str]:
    """The variables a CUDA job gets on top of the fixed job environment (only set ones)."""
    env: dict[str, str] = {}
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if nvidia_visible_devices is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = nvidia_visible_devices
    if library_dirs:
        env["LD_LIBRARY_PATH"] = ":".join(str(p) for p in library_dirs)
    return env


def discover(
    *,
    cuda_visible_devices: str | None = None,
    nvidia_visible_devices: str | None = None,
    library_dirs: list[Path] | None = None,
    device_root: Path = Path("/dev"),
    proc_root: Path = Path("/proc"),
    sys_root: Path = Path("/sys"),
) -> GpuAccess:
    """Everything a CUDA job on this host may use beyond a CPU job.

    `library_dirs` (configured) are also put on the job's `LD_LIBRARY_PATH`; the dirs
    `ldconfig` knows are only made readable (the loader finds them through its cache).
    Without NVIDIA device nodes there is no driver to serve, and no path is opened up.
    """
    configured = [Path(p) for p in library_dirs or []]
    devices = device_nodes(device_root)
    reads: list[Path] = []
    if devices:  # no driver, nothing of it to read
        libraries = [*configured, *(p for p in driver_library_dirs() if p not in configured)]
        reads = [*system_read_paths(proc_root, sys_root), *libraries]
    return GpuAccess(
        devices=tuple(devices),
        read_paths=tuple(reads),
        environment=environment(cuda_visible_devices, nvidia_visible_devices, configured),
    )
