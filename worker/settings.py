"""Configuration of a worker process: one pydantic-settings class, `TORCHPORT_` prefix."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from persistence.settings import CommonSettings
from worker.sandbox.settings import SandboxSettings

_SANDBOX: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(SandboxSettings)}
"""The sandbox's own defaults: each limit is written once, in `SandboxSettings`."""


class WorkerSettings(CommonSettings):
    """Settings of `torchport worker` (and the workers `torchport serve` starts)."""

    model_config = SettingsConfigDict(
        env_prefix="TORCHPORT_", extra="ignore", populate_by_name=True
    )

    work_dir: Path | None = Field(
        default=None, description="Scratch space for running jobs; default `<data_dir>/work`."
    )
    queues: str = Field(default="cpu", description="Comma-separated queues to consume.")
    worker_name: str = Field(
        default_factory=socket.gethostname, description="Shown as the job's worker."
    )
    sandbox_enabled: bool = Field(
        default=_SANDBOX["enabled"],
        description="Confine uploaded code (rlimits, Landlock, seccomp; see docs/sandbox.md). "
        "Turn off only for trusted code in development.",
    )
    sandbox_use_bwrap: bool | Literal["auto"] = Field(
        default="auto", description="Wrap jobs in bubblewrap: true, false, or auto (when it works)."
    )
    sandbox_max_memory_mb: int = Field(
        default=_SANDBOX["max_memory_mb"], ge=256, description="Upper bound on a job's `memory_mb`."
    )
    sandbox_max_timeout_s: float = Field(
        default=_SANDBOX["max_timeout_s"], gt=0, description="Upper bound on a job's `timeout_s`."
    )
    sandbox_disk_mb: int = Field(
        default=_SANDBOX["disk_mb"],
        ge=64,
        description="What one job may hold on disk (uploads, scratch, outputs, deleted files "
        "it keeps open); past it the job is stopped: `disk_quota_exceeded`.",
    )
    sandbox_max_inodes: int = Field(
        default=_SANDBOX["max_inodes"],
        ge=100,
        description="Files and directories one job may create.",
    )
    sandbox_fsize_mb: int = Field(
        default=_SANDBOX["fsize_mb"], ge=16, description="The largest single file a job may write."
    )
    sandbox_allow_without_landlock: bool = Field(
        default=False,
        description="Run jobs on a kernel without Landlock (recorded in each report). Not "
        "needed under gVisor, which is detected; elsewhere the worker refuses to start.",
    )
    sandbox_spares: bool = Field(
        default=_SANDBOX["spares"],
        description="Keep a pre-forked, self-warmed spare job child and loader child while "
        "idle, so a job at an idle worker skips the fork and the cold start (costs their "
        "private memory, ~70 MB).",
    )
    sandbox_gpu_library_dirs: list[Path] = Field(
        default_factory=list,
        description="NVIDIA driver library dirs the loader cache lacks (GPU workers only).",
    )
    cuda_visible_devices: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TORCHPORT_CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
        description="The GPU(s) this worker's CUDA jobs run on; passed to the sandbox.",
    )
    nvidia_visible_devices: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TORCHPORT_NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
        description="Passed to the sandbox's CUDA jobs when set.",
    )
    max_artifact_bytes: int = Field(
        default=16 * 2**30, gt=0, description="A job output over this size fails the job."
    )
    infra_retries: int = Field(
        default=3, ge=0, description="Retries of a task after database, store or broker errors."
    )
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of one delivery, all of it (DNS, connect, TLS, sending, the "
        "answer's headers); not per read.",
    )
    webhook_retries: int = Field(default=5, ge=0, description="Retries of a failed delivery.")
    webhook_backoff_s: float = Field(
        default=2.0, gt=0, description="First retry delay; doubles with each retry."
    )
    webhook_allow_hosts: str = Field(
        default="",
        description="Comma-separated host names (or IP literals) webhooks may be sent to even "
        "though they are not public (loopback, private, link-local, …); every other callback "
        "URL must resolve to public addresses only.",
    )
    webhook_secret: str | None = Field(
        default=None,
        min_length=32,
        description="Signs webhooks of jobs submitted without an API key.",
    )

    @property
    def resolved_work_dir(self) -> Path:
        """The scratch directory of running jobs."""
        return self.work_dir or self.data_dir / "work"

    @property
    def queue_list(self) -> list[str]:
        """The queues to consume."""
        return [q.strip() for q in self.queues.split(",") if q.strip()]

    def sandbox_settings(self) -> SandboxSettings:
        """The sandbox's settings: every `sandbox_<name>` setting as `<name>`, and the GPU
        confinement when this worker consumes the gpu queue."""
        names = {f.name for f in dataclasses.fields(SandboxSettings)}
        values: dict[str, Any] = {
            name.removeprefix("sandbox_"): value
            for name, value in self
            if name.startswith("sandbox_") and name.removeprefix("sandbox_") in names
        }
        return SandboxSettings(
            **values,
            gpu="gpu" in self.queue_list,
            cuda_visible_devices=self.cuda_visible_devices,
            nvidia_visible_devices=self.nvidia_visible_devices,
        )
