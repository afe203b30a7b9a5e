"""Configuration of the sandbox and the shapes of one job and its result.

`SandboxSettings` is a plain dataclass; the service wraps it in its pydantic
settings (TORCHPORT_ prefix), so this package never reads the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schemas import ErrorBody, ReportDocument

NOBODY = 65534


@dataclass
class SandboxSettings:
    """How jobs are isolated and limited."""

    enabled: bool = True
    """False runs the engine in this process with no isolation (debugging only)."""
    use_bwrap: bool | Literal["auto"] = "auto"
    """True: bubblewrap must work (start fails otherwise); "auto": use it when it works."""
    uid: int | None = None
    """Job uid when the worker runs as root (default 65534); ignored otherwise."""
    gid: int | None = None
    work_root: Path | None = None
    """Staging directories and the zygote's files; a fresh temporary dir by default."""
    max_memory_mb: int = 16384
    """Upper bound on a job's `memory_mb`."""
    max_timeout_s: float = 3600
    """Upper bound on a job's `timeout_s`."""
    cpu_s: int | None = None
    """RLIMIT_CPU; default: timeout * CPU count + 10 s."""
    fsize_mb: int = 4096
    nofile: int = 256
    nproc: int = 4096
    """RLIMIT_NPROC (counts threads, and for a shared uid all of its processes)."""
    tmpfs_mb: int = 256
    max_report_bytes: int = 8 << 20
    max_json_bytes: int = 128 << 20
    max_program_bytes: int = 8 << 30
    early_copy_bytes: int = 64 << 20
    """Programs up to this size are copied out of the job's reach and hashed while the
    job child exits; larger ones are moved after the exit (runner._take_outputs)."""
    max_log_bytes: int = 1 << 20
    max_progress_line: int = 1 << 14
    start_timeout_s: float = 180
    warm_up: bool = True
    spares: bool = True
    """Keep a pre-forked, self-warmed spare job child and loader child while idle (zygote.py):
    a CPU job arriving at an idle worker skips the fork and the cold start. Costs the
    spares' private memory; off for one-shot runs (`torchport export`)."""
    python: str | None = None
    """Interpreter for the zygote; this one by default."""
    kill_grace_s: float = 5.0
    allow_without_landlock: bool = False
    """Run jobs where the kernel has no Landlock (recorded in every report). Under gVisor,
    whose kernel has none, this is implied; elsewhere the runner refuses to start."""
    gpu: bool = False
    """A GPU worker: its `device: "cuda"` jobs may use the NVIDIA devices (gpu.py)."""
    cuda_visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES for the zygote and CUDA jobs (the worker's pinning); unset: all."""
    nvidia_visible_devices: str | None = None
    gpu_library_dirs: list[Path] = field(default_factory=list)
    """Driver library dirs the loader's cache does not know (put on LD_LIBRARY_PATH);
    those `ldconfig -p` lists are found and made readable without this."""
    gpu_data_margin_mb: int = 8192
    """Added to a CUDA job's RLIMIT_DATA: the driver maps large private writable areas
    (its context, the CUDA libraries' data) that count there but are mostly never touched."""
    gpu_rss_margin_mb: int = 2048
    """Added to a CUDA job's RSS limit: the driver's and CUDA libraries' resident pages."""

    def job_ids(self) -> tuple[int, int] | None:
        """(uid, gid) jobs drop to, or None when the worker is not root."""
        if os.geteuid() != 0:
            return None
        uid = NOBODY if self.uid is None else self.uid
        gid = NOBODY if self.gid is None else self.gid
        return uid, gid


def local_settings(options: Mapping[str, Any], environ: Mapping[str, str]) -> SandboxSettings:
    """Settings of the one-shot path (`torchport export`, run by the user in their own
    shell): a CUDA job gets a GPU runner pinned as that shell pins its GPUs; nothing
    else of `environ` is used."""
    if options.get("device") != "cuda":
        return SandboxSettings(spares=False)
    return SandboxSettings(
        spares=False,
        gpu=True,
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        nvidia_visible_devices=environ.get("NVIDIA_VISIBLE_DEVICES"),
    )


@dataclass
class SandboxJob:
    """One export to run: uploaded files, ExportOptions JSON, and where results go
    (the runner creates `job_dir/out`)."""

    model: Path
    inputs: Path | None
    weights: Path | None
    options: dict[str, Any]
    job_dir: Path


@dataclass
class SandboxResult:
    """What a job produced, read back as untrusted data and validated."""

    report: ReportDocument
    artifacts: dict[str, Path] = field(default_factory=dict)
    error: ErrorBody | None = None
    stdout_tail: str = ""

    @property
    def succeeded(self) -> bool:
        """Whether the job produced a verified program."""
        return self.report.status == "succeeded"
