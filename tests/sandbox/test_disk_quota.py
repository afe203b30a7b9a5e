"""A job cannot take more disk than its quota (issue: one job wrote 5 x 1 GiB files and
100k inodes; RLIMIT_FSIZE bounds one file only). The supervisor measures the job's
staging directory and the deleted files it keeps open, and stops it past `disk_mb` or
`max_inodes`: `disk_quota_exceeded`, whatever the way it took the space."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import ExportOptions
from tests.sandbox.conftest import MODELS, fresh_runner
from worker.sandbox import SandboxJob, SandboxResult, SandboxRunner, SandboxSettings
from worker.sandbox.host import quota, results

DISK_MB = 64
MAX_INODES = 500


@pytest.fixture(scope="module")
def runner() -> Iterator[SandboxRunner]:
    root = Path(tempfile.mkdtemp(prefix="torchport-quota-"))
    os.chmod(root, 0o755)
    with fresh_runner(
        work_root=root / "work",
        disk_mb=DISK_MB,
        max_inodes=MAX_INODES,
        fsize_mb=32,
        spares=False,
    ) as started:
        yield started
    shutil.rmtree(root, ignore_errors=True)


def _run(runner: SandboxRunner, mode: str) -> tuple[SandboxResult, float]:
    assert runner.work_root is not None
    upload = Path(tempfile.mkdtemp(dir=runner.work_root.parent)) / f"quota_{mode}.py"
    text = (MODELS / "hostile_quota.py").read_text()
    upload.write_text(text.replace('MODE = "many_files"', f"MODE = {mode!r}"))
    os.chmod(upload.parent, 0o755)
    started = time.monotonic()
    result = runner.run(
        SandboxJob(
            model=upload,
            inputs=None,
            weights=None,
            options=ExportOptions(timeout_s=60),
            job_dir=Path(tempfile.mkdtemp(dir=runner.work_root.parent)),
        )
    )
    return result, time.monotonic() - started


def _assert_space_given_back(runner: SandboxRunner) -> None:
    assert runner.wait_for_cleanup(30)
    assert runner.work_root is not None
    use = quota.measure(runner.work_root, [], 1 << 62, 1 << 62)
    assert use.bytes < 8 << 20


@pytest.mark.parametrize("mode", ["many_files", "big_files"])
def test_a_job_over_its_quota_is_stopped_while_it_runs(runner: SandboxRunner, mode: str) -> None:
    result, elapsed = _run(runner, mode)
    assert result.error is not None
    assert result.error.code == "disk_quota_exceeded"
    details = result.error.details
    assert details["disk_mb"] == DISK_MB
    assert details["max_inodes"] == MAX_INODES
    if mode == "many_files":
        assert details["inodes"] > MAX_INODES
    else:
        assert details["used_mb"] > DISK_MB
    assert elapsed < 15  # stopped, not left to sleep its 20 s
    _assert_space_given_back(runner)


@pytest.mark.skipif(os.geteuid() != 0, reason="reads the job's /proc/<pid>/fd as root")
def test_deleted_files_kept_open_count(runner: SandboxRunner) -> None:
    result, elapsed = _run(runner, "unlinked")
    assert result.error is not None
    assert result.error.code == "disk_quota_exceeded"
    assert result.error.details["open_files_checked"] is True
    assert result.error.details["unlinked_mb"] > DISK_MB / 2
    assert elapsed < 15


def test_one_file_over_the_file_size_limit_is_the_quota(runner: SandboxRunner) -> None:
    result, _ = _run(runner, "one_big_file")
    assert result.error is not None
    assert result.error.code == "disk_quota_exceeded"
    details = result.error.details
    # Two detectors race, both right: the write fails with EFBIG at RLIMIT_FSIZE (= the
    # quota) and the job's own error is reclassified, or the watcher measures the file at
    # the quota first and stops the job.
    if "original_code" in details:
        assert details["original_code"] == "model_import_failed"
    else:
        assert details["used_mb"] >= DISK_MB


def test_what_a_finished_job_left_behind_counts(runner: SandboxRunner) -> None:
    interval = runner.settings.disk_check_interval_s
    runner.settings.disk_check_interval_s = 3600  # only the first check, at the start
    try:
        result, _ = _run(runner, "left_behind")
    finally:
        runner.settings.disk_check_interval_s = interval
    assert result.error is not None
    assert result.error.code == "disk_quota_exceeded"
    assert result.error.details["used_mb"] > DISK_MB
    assert [a.name for a in result.report.artifacts] == []  # no program is served


def test_a_benign_job_reports_its_disk_use(runner: SandboxRunner) -> None:
    result, _ = _run(runner, "none")
    assert result.error is None, result.error
    assert result.report.sandbox is not None
    disk = result.report.sandbox.details["disk"]
    assert disk["disk_mb"] == DISK_MB
    assert 0 < disk["inodes"] < MAX_INODES
    assert 0 < disk["used_mb"] < DISK_MB
    assert runner.settings.fsize_mb == 32


def test_measure_stops_counting_past_a_limit(tmp_path: Path) -> None:
    for index in range(50):
        (tmp_path / f"f{index}").write_bytes(b"x" * 4096)
    whole = quota.measure(tmp_path, [], 1 << 40, 1 << 40)
    assert whole.inodes == 50
    assert whole.bytes >= 50 * 4096
    cut = quota.measure(tmp_path, [], 1 << 40, 10)
    assert cut.inodes == 11  # one past the limit, then it stops
    assert cut.over(1 << 40, 10)
    assert not whole.over(1 << 40, 50)


def test_a_use_just_over_the_quota_never_reads_as_the_quota() -> None:
    settings = SandboxSettings(disk_mb=DISK_MB)
    over = results.describe_disk(quota.DiskUse(bytes=(DISK_MB << 20) + 4096), settings)
    assert over["used_mb"] == DISK_MB + 0.1
    exact = results.describe_disk(quota.DiskUse(bytes=DISK_MB << 20), settings)
    assert exact["used_mb"] == DISK_MB
