"""A job's limits are its own, capped by the worker's, in one place (`supervisor.job_limits`)."""

from __future__ import annotations

from schemas import ExportOptions
from worker.sandbox.host.supervisor import job_limits
from worker.sandbox.settings import SandboxSettings


def test_the_worker_caps_a_jobs_time_and_memory() -> None:
    settings = SandboxSettings(max_timeout_s=60, max_memory_mb=1024, cpu_s=None)
    options = ExportOptions(timeout_s=3000, memory_mb=8192)
    limits, timeout, memory_mb = job_limits(options, settings, baseline_mb=100)
    assert (timeout, memory_mb) == (60, 1024)
    assert limits["memory_mb"] == 1024 + 100  # RLIMIT_DATA counts the zygote's data too
    assert limits["cpu_s"] >= 60 + 10


def test_a_job_under_the_caps_keeps_its_own() -> None:
    settings = SandboxSettings(max_timeout_s=600, max_memory_mb=4096)
    limits, timeout, memory_mb = job_limits(
        ExportOptions(timeout_s=30, memory_mb=512), settings, baseline_mb=0
    )
    assert (timeout, memory_mb, limits["memory_mb"]) == (30, 512, 512)
    assert limits["fsize_mb"] == min(settings.fsize_mb, settings.disk_mb)


def test_a_cuda_job_gets_the_drivers_margin() -> None:
    settings = SandboxSettings(max_memory_mb=4096, gpu_data_margin_mb=1000)
    limits, _, memory_mb = job_limits(
        ExportOptions(memory_mb=2048), settings, baseline_mb=0, gpu_job=True
    )
    assert memory_mb == 2048
    assert limits["memory_mb"] == 2048 + 1000
