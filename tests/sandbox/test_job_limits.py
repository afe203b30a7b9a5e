"""A job's limits are its own, capped by the worker's, in one place (`supervisor.job_limits`)."""

from __future__ import annotations

import json
from pathlib import Path

from schemas import ExportOptions
from worker.sandbox.host.staging import stage
from worker.sandbox.host.supervisor import DEFAULT_MEMORY_MB, job_limits, sized
from worker.sandbox.settings import SandboxJob, SandboxSettings


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


def test_the_mapped_model_upload_counts_in_rlimit_data_not_in_memory_mb() -> None:
    settings = SandboxSettings(max_memory_mb=16384)
    limits, _, memory_mb = job_limits(
        ExportOptions(memory_mb=8192), settings, baseline_mb=100, mapped_bytes=(6 << 30) + 1
    )
    assert memory_mb == 8192  # the RSS watchdog's budget: the pages read count there
    assert limits["memory_mb"] == 8192 + 100 + 6144 + 1  # the whole mapping, rounded up


def test_a_job_without_memory_mb_is_sized_from_its_uploads() -> None:
    settings = SandboxSettings(max_memory_mb=16384, disk_mb=16384, max_disk_mb=32768)
    small, same = sized(ExportOptions(), 10 << 20, settings)
    assert small.memory_mb == DEFAULT_MEMORY_MB and same is settings
    big, roomy = sized(ExportOptions(), 3 << 30, settings)
    assert big.memory_mb == 2 * 3072 + 4096  # two MB per MB of upload, plus 4 GiB
    # the largest file holds its weights widened to float32 (ONNX's external data of a
    # bfloat16 checkpoint), where the worker's 4096 would not
    assert roomy.disk_mb == 16384 and (settings.fsize_mb, roomy.fsize_mb) == (4096, 3 * 3072)
    _, modest = sized(ExportOptions(), 1 << 30, settings)  # 3 GB: under the worker's 4
    assert modest.fsize_mb == settings.fsize_mb
    huge, roomier = sized(ExportOptions(), 6 << 30, settings)
    assert huge.memory_mb == 16384  # the worker's maximum
    assert roomier.disk_mb == 4 * 6144 and roomier.fsize_mb == roomier.disk_mb
    _, capped = sized(ExportOptions(), 20 << 30, settings)
    assert capped.disk_mb == 32768
    # what the job asked for stays, within the worker's cap (job_limits)
    converting, _ = sized(ExportOptions(targets=["onnx", "aoti"]), 1 << 30, settings)
    assert converting.memory_mb == (2 + 2 * 2) * 1024 + 4096  # two more MB per MB per target
    # four for executorch: its float32 lowering holds the weights and XNNPACK's copy
    lowering, _ = sized(ExportOptions(targets=["onnx", "executorch"]), 1 << 30, settings)
    assert lowering.memory_mb == (2 + 2 + 4) * 1024 + 4096
    own, _ = sized(ExportOptions(memory_mb=1024), 3 << 30, settings)
    assert own.memory_mb == 1024
    limits, _, memory_mb = job_limits(big, settings, baseline_mb=0)
    assert memory_mb == 10240 and limits["memory_mb"] == 10240


def test_the_staged_options_are_the_sized_ones(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_bytes(b"x" * 4096)
    job = SandboxJob(
        model=model, inputs=None, weights=None, options=ExportOptions(), job_dir=tmp_path
    )
    settings = SandboxSettings()
    options, _ = stage(
        job, tmp_path / "staging", None, 60.0, lambda size: sized(job.options, size, settings)
    )
    written = json.loads((tmp_path / "staging" / "options.json").read_text())
    assert written["memory_mb"] == options.memory_mb == DEFAULT_MEMORY_MB
    assert job.options.memory_mb is None
