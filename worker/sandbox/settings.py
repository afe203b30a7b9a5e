"""Configuration of the sandbox and the shapes of one job and its result.

`SandboxSettings` is a pydantic model that reads no environment: a worker's settings
nest it (`WorkerSettings.sandbox`, `TORCHPORT_SANDBOX_<NAME>`), so each sandbox setting
has one name, one default and one set of bounds, here.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from schemas import ErrorBody, ExportOptions, ReportDocument
from schemas.job import UPLOAD_ROLES
from schemas.limits import MAX_TIMEOUT_S

NOBODY = 65534
_MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class SandboxSettings(BaseModel):
    """How jobs are isolated and limited. The attribute docstrings are the settings'
    descriptions (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """False runs the engine in this process with no isolation (debugging only)."""
    use_bwrap: bool | Literal["auto"] = "auto"
    """True: bubblewrap must work (start fails otherwise); "auto": use it when it works."""
    uid: int | None = None
    """Job uid when the worker runs as root (default 65534); ignored otherwise. Jobs that
    run while another does get a uid of their own from `slot_uid_base + 1` on."""
    gid: int | None = None
    """Job gid when the worker runs as root (default 65534); ignored otherwise."""
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
    max_memory_mb: int = Field(default=16384, ge=256)
    """Upper bound on a job's `memory_mb`."""
    max_timeout_s: float = Field(default=3600, gt=0, le=MAX_TIMEOUT_S)
    """Upper bound on a job's `timeout_s`."""
    cpu_s: int | None = None
    """RLIMIT_CPU; default: timeout * CPU count + 10 s."""
    fsize_mb: int = Field(default=4096, ge=16)
    """RLIMIT_FSIZE: the largest file a job may write (lowered to `disk_mb` if above)."""
    disk_mb: int = Field(default=16384, ge=64)
    """What one job may hold on disk: its staging directory (uploads, scratch, outputs)
    and the deleted files it keeps open. Past it the job is killed: `disk_quota_exceeded`
    (quota.py). A job whose uploads need more gets more, up to `max_disk_mb`
    (docs/contract.md §2, *Limits sized from the upload*)."""
    max_disk_mb: int = Field(default=65536, ge=64)
    """Upper bound on what a job with big uploads may hold on disk (`disk_mb` and
    `fsize_mb` grow with the uploads up to it)."""
    max_inodes: int = Field(default=20000, ge=100)
    """Files and directories one job may have in its staging directory."""
    disk_check_interval_s: float = 0.25
    """How often the supervisor measures a running job's disk use."""
    nofile: int = 256
    """RLIMIT_NOFILE: files one job process may hold open."""
    nproc: int = 4096
    """RLIMIT_NPROC (counts threads, and for a shared uid all of its processes)."""
    pids_max: int = 2048
    """Threads and processes of one job and its loader together, where the runner can give
    each job a pids cgroup of its own (cgroups.py)."""
    tmpfs_mb: int = 256
    """Size of the private /tmp (tmpfs) bubblewrap gives the zygote and its jobs."""
    max_report_bytes: int = 8 << 20
    """Largest `report.json` accepted from a job."""
    max_report_items: int = 100_000
    """Most JSON items (`outputs.count_items`: values and members) a `report.json` may
    hold; a larger one is refused before it is parsed (a real report holds ~500)."""
    max_json_bytes: int = 32 << 20
    """Largest `graph.json` or `signature.json` accepted from a job."""
    max_json_items: int = 1_000_000
    """Most JSON items a `graph.json` or `signature.json` may hold, refused unparsed past
    it: ~21,000 nodes (a 32-layer Llama's graph holds 3,837 nodes, 176,000 items, 2.9 MB).
    Parsing a document at the item and byte limits grows the worker by < 200 MiB."""
    max_program_bytes: int = 8 << 30
    """Largest `program.pt2` (or target artifact) accepted from a job."""
    early_copy_bytes: int = 64 << 20
    """Programs up to this size are copied out of the job's reach and hashed while the
    job child exits; larger ones are copied and hashed after the exit (results.finish)."""
    max_log_bytes: int = 1 << 20
    """What is kept of a job's own output (stdout and stderr)."""
    max_progress_line: int = 1 << 14
    """Longest line a job child may write on its progress pipe."""
    start_timeout_s: float = 180
    """How long the zygote may take to start (and warm up) before the worker gives up."""
    warm_up: bool | Literal["during_first_job"] = True
    """True: the zygote runs the whole pipeline once before it serves (later forks start
    warm). "during_first_job" (one-shot runs): it serves at once and, while the first job
    traces, warms up only what that job's round-trip loader, forked later, will need."""
    warm_libraries: list[Annotated[str, Field(pattern=_MODULE_NAME)]] | None = None
    """Model libraries the zygote imports during its warm-up, before it forks, so a job
    pays only for its own model's modules (warm_libraries.py): import names, e.g.
    `["transformers", "diffusers"]`; a dotted name is imported as the module it names.
    Default: those of transformers, diffusers, peft, timm and torchvision installed. One
    whose import fails or starts a thread is skipped (the zygote's log says why); `[]`
    warms none. Only with `warm_up` true, and never on a GPU worker (warm_libraries.py)."""
    spares: bool = True
    """Keep a pre-forked, self-warmed spare job child and loader child while idle (spares.py):
    a CPU job arriving at an idle worker skips the fork and the cold start. Costs the
    spares' private memory; off for one-shot runs (`torchport export`)."""
    python: str | None = None
    """Interpreter for the zygote; this one by default."""
    kill_grace_s: float = 5.0
    """How long a killed job's output pipes are still read after the kill."""
    allow_without_landlock: bool = False
    """Run jobs where the kernel has no Landlock (recorded in every report). Under gVisor,
    whose kernel has none, this is implied; elsewhere the runner refuses to start."""
    gpu: bool = False
    """A GPU worker: its `device: "cuda"` jobs may use the NVIDIA devices (gpu.py)."""
    cuda_visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES for the zygote and CUDA jobs (the worker's pinning); unset: all."""
    nvidia_visible_devices: str | None = None
    """NVIDIA_VISIBLE_DEVICES for CUDA jobs, when set (the container runtime's pinning)."""
    gpu_library_dirs: list[Path] = Field(default_factory=list)
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


def local_settings(options: ExportOptions, environ: Mapping[str, str]) -> SandboxSettings:
    """Settings of the one-shot path (`torchport export`, run by the user in their own
    shell): a CUDA job gets a GPU runner pinned as that shell pins its GPUs; nothing
    else of `environ` is used."""
    if options.device != "cuda":
        return SandboxSettings(spares=False, warm_up="during_first_job")
    return SandboxSettings(
        spares=False,
        warm_up="during_first_job",
        gpu=True,
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        nvidia_visible_devices=environ.get("NVIDIA_VISIBLE_DEVICES"),
    )


class UploadSource(Protocol):
    """An uploaded file, written where the job is staged (`staging.stage`): a local
    file (`LocalFile`), or a blob of the worker's store fetched straight into the
    job's directory."""

    @property
    def name(self) -> str:
        """The file's base name in the job's `in` directory."""
        ...

    def copy_to(self, target: Path) -> None:
        """Write the file's bytes to `target`, a new file of its own: never a link to
        bytes anyone else keeps (the job's uid becomes the copy's owner)."""
        ...


@dataclass(frozen=True)
class LocalFile:
    """An upload that is a file on this machine (`torchport export`, tests)."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def copy_to(self, target: Path) -> None:
        shutil.copyfile(self.path, target)


@dataclass(frozen=True)
class SpentFile:
    """A file of this machine its owner gives up to the job: `torchport export`'s own zip
    of a checkpoint directory, made to be sent once and deleted. Moved into the job's
    staging (no second copy of a checkpoint's GBs: 937 MB took 0.8 s to copy), copied
    where the staging is on another file system; gone from `path` either way after."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def copy_to(self, target: Path) -> None:
        try:
            os.rename(self.path, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copyfile(self.path, target)
            self.path.unlink()


@dataclass
class SandboxJob:
    """One export to run: its uploads (paths or `UploadSource`s, copied into the job's
    staging directory), its options, validated before they get here (a
    `SandboxJob` takes no other), and where results go (the runner creates
    `job_dir/out`)."""

    model: Path | UploadSource
    inputs: Path | UploadSource | None
    weights: Path | UploadSource | None
    options: ExportOptions
    job_dir: Path
    calibration: Path | UploadSource | None = None
    """Calibration inputs of `quantize.scheme: int8`."""

    def __post_init__(self) -> None:
        if not isinstance(self.options, ExportOptions):
            raise TypeError(
                "SandboxJob.options must be ExportOptions, validated where the job came "
                f"from, not {type(self.options).__name__}"
            )

    def uploads(self) -> dict[str, UploadSource]:
        """The uploads by role (`UPLOAD_ROLES`), the absent ones left out."""
        found: dict[str, UploadSource] = {}
        for role in UPLOAD_ROLES:
            source = getattr(self, role)
            if source is not None:
                found[role] = LocalFile(source) if isinstance(source, Path) else source
        return found


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
