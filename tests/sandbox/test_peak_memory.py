"""A job's peak memory per stage is exact in the sandbox: the job child holds its
`/proc/self/clear_refs` open from before its lockdown (lockdown.apply), so no thread
samples its resident set (engine/profile/resident_memory.py)."""

from __future__ import annotations

import os

import pytest

from tests.sandbox.conftest import Arena


@pytest.mark.skipif(os.geteuid() != 0, reason="a job keeps the worker's uid: not its reset")
def test_the_job_resets_its_peak_without_a_sampling_thread(each_arena: Arena) -> None:
    arena = each_arena
    result, _, _ = arena.run(arena.model("peak_probe"))
    assert result.report.status == "succeeded", result.error
    probe = [line for line in result.stdout_tail.splitlines() if "PEAK-RESET=" in line]
    assert len(probe) == 1, result.stdout_tail
    assert "PEAK-RESET=True" in probe[0]
    assert "torchport-resident-memory" not in probe[0]
    peaks = {stage.name: stage.peak_rss_mb for stage in result.report.stages}
    assert set(peaks) >= {"loading", "tracing", "decomposing", "verifying", "serializing"}
    assert all(peak is not None and peak > 0 for peak in peaks.values()), peaks
