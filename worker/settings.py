"""Configuration of a worker process: one pydantic-settings class, `TORCHPORT_` prefix."""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import SettingsConfigDict

from persistence.settings import CommonSettings
from persistence.webhook_secrets import signing_key
from worker.sandbox.settings import SandboxSettings


class WorkerSettings(CommonSettings):
    """Settings of `torchport worker` (and the workers `torchport serve` starts)."""

    # TORCHPORT_SANDBOX_DISK_MB is `sandbox.disk_mb`: one split after the prefix's field.
    model_config = SettingsConfigDict(
        env_prefix="TORCHPORT_",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="ignore",
        populate_by_name=True,
    )

    work_dir: Path | None = Field(
        default=None, description="Scratch space for running jobs; default `<data_dir>/work`."
    )
    queues: str = Field(default="cpu", description="Comma-separated queues to consume.")
    worker_name: str = Field(
        default_factory=socket.gethostname, description="Shown as the job's worker."
    )
    sandbox: SandboxSettings = Field(
        default_factory=SandboxSettings,
        description="How jobs are confined and limited: every field of "
        "`worker.sandbox.SandboxSettings`, each as `TORCHPORT_SANDBOX_<NAME>`.",
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
        description="Signs webhooks of jobs submitted without an API key: `whsec_` and the "
        "base64 of at least 24 random bytes (Standard Webhooks), or any other text of 32 or "
        "more characters, whose UTF-8 bytes are then the key.",
    )

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret_gives_a_key(cls, value: str | None) -> str | None:
        if value is not None:
            signing_key(value)  # a malformed whsec_ secret fails at start-up
        return value

    @property
    def resolved_work_dir(self) -> Path:
        """The scratch directory of running jobs."""
        return self.work_dir or self.data_dir / "work"

    @property
    def queue_list(self) -> list[str]:
        """The queues to consume."""
        return [q.strip() for q in self.queues.split(",") if q.strip()]

    def sandbox_settings(self) -> SandboxSettings:
        """The sandbox's settings (`sandbox`), with the GPU confinement when this worker
        consumes the gpu queue, pinned to this worker's GPUs."""
        return self.sandbox.model_copy(
            update={
                "gpu": "gpu" in self.queue_list,
                "cuda_visible_devices": self.cuda_visible_devices,
                "nvidia_visible_devices": self.nvidia_visible_devices,
            }
        )
