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
    """Job uid when the worker runs as root (default 65534); ignored otherwise. Jobs that
    run while another does get a uid of their own from `slot_uid_base + 1` on."""
    gid: int | None = None
    slot_uid_base: int = 100000
    """Concurrent jobs of a root worker never share a uid (RLIMIT_NPROC counts per uid,
    and a process may set another's limits when their uids match): the first job runs as
    `uid`, a job started while k others run as `slot_uid_base + k` (uid and gid). Slots
    are the machine's, not the runner's: all workers on one machine lease them (slots.py)."""
    slot_dirs: list[Path] | None = None
    """Where the machine's slot locks live, first usable wins; default
    slots.default_directories() (`/run/torchport/slots`, then one in the temp dir)."""
    work_root: Path | None = None
    """Staging directories and the zygote's files; a fresh temporary dir by default."""
    max_memory_mb: int = 16384
    """Upper bound on a job's `memory_mb`."""
    max_timeout_s: float = 3600
    """Upper bound on a job's `timeout_s`."""
    cpu_s: int | None = None
    """RLIMIT_CPU; default: timeout * CPU count + 10 s."""
    fsize_mb: int = 4096
    """RLIMIT_FSIZE: the largest file a job may write (lowered to `disk_mb` if above)."""
    disk_mb: int = 16384
    """What one job may hold on disk: its staging directory (uploads, scratch, outputs)
    and the deleted files it keeps open. Past it the job is killed: `disk_quota_exceeded`
    (quota.py)."""
    max_inodes: int = 20000
    """Files and directories one job may have in its staging directory."""
    disk_check_interval_s: float = 0.25
    """How often the supervisor measures a running job's disk use."""
    nofile: int = 256
    nproc: int = 4096
    """RLIMIT_NPROC (counts threads, and for a shared uid all of its processes)."""
    pids_max: int = 2048
    """Threads and processes of one job and its loader together, where the runner can give
    each job a pids cgroup of its own (cgroups.py)."""
    tmpfs_mb: int = 256
    max_report_bytes: int = 8 << 20
    max_json_bytes: int = 128 << 20
    max_program_bytes: int = 8 << 30
    early_copy_bytes: int = 64 << 20
    """Programs up to this size are copied out of the job's reach and hashed while the
    job child exits; larger ones are moved after the exit (outputs.take_outputs)."""
    max_log_bytes: int = 1 << 20
    max_progress_line: int = 1 << 14
    start_timeout_s: float = 180
    warm_up: bool | Literal["during_first_job"] = True
    """True: the zygote runs the whole pipeline once before it serves (later forks start
    warm). "during_first_job" (one-shot runs): it serves at once and, while the first job
    traces, warms up only what that job's round-trip loader, forked later, will need."""
    spares: bool = True
    """Keep a pre-forked, self-warmed spare job child and loader child while idle (spares.py):
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

    def job_ids(self, slot: int = 0) -> tuple[int, int] | None:
        """(uid, gid) the job in concurrency slot `slot` drops to, or None when the worker
        is not root."""
        if os.geteuid() != 0:
            return None
        if slot:
            return self.slot_uid_base + slot, self.slot_uid_base + slot
        uid = NOBODY if self.uid is None else self.uid
        gid = NOBODY if self.gid is None else self.gid
        return uid, gid


def local_settings(options: Mapping[str, Any], environ: Mapping[str, str]) -> SandboxSettings:
    """Settings of the one-shot path (`torchport export`, run by the user in their own
    shell): a CUDA job gets a GPU runner pinned as that shell pins its GPUs; nothing
    else of `environ` is used."""
    if options.get("device") != "cuda":
        return SandboxSettings(spares=False, warm_up="during_first_job")
    return SandboxSettings(
        spares=False,
        warm_up="during_first_job",
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
