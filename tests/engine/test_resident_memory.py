"""`engine.profile.resident_memory`: the resident set, peaks over a stretch, freed memory
given back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest
from engine.pipeline.run_state import ExportRun
from engine.profile import resident_memory
from engine.profile.resident_memory import PeakWatch
from schemas import ExportOptions

MB = 2**20


def _allocate(mb: int, hold_s: float = 0.0) -> None:
    block = torch.ones(mb * MB // 4)  # touched: resident, not only reserved
    time.sleep(hold_s)
    del block


def test_resident_and_high_water_are_read_from_proc() -> None:
    now, high = resident_memory.resident(), resident_memory.high_water()
    assert now is not None and now > 10 * MB
    assert high is not None and high >= now


def test_a_freed_allocation_counts_in_the_peak() -> None:
    watch = PeakWatch().start()
    _allocate(200)
    peak, added = watch.stop()
    assert peak is not None and added is not None
    assert added >= 190
    assert peak >= added


def test_sampled_where_the_peak_cannot_be_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resident_memory, "reset_peak", lambda: False)
    _allocate(300)  # the process's record is now above what the watch will see
    watch = PeakWatch().start()
    assert not watch.reset
    _allocate(120, hold_s=0.3)
    _, added = watch.stop()
    assert added is not None and 100 <= added < 250


def test_an_inner_watch_resetting_the_mark_does_not_lose_the_outer_peak() -> None:
    outer = PeakWatch().start()
    if not outer.reset:
        pytest.skip("this process may not reset its high-water mark")
    _allocate(250)
    inner = PeakWatch().start()
    _allocate(50)
    _, inner_added = inner.stop()
    _, outer_added = outer.stop()
    assert inner_added is not None and 45 <= inner_added < 200
    assert outer_added is not None and outer_added >= 240


def test_an_inner_reset_does_not_hand_a_sampling_watch_the_process_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not resident_memory.reset_peak():
        pytest.skip("this process may not reset its high-water mark")
    _allocate(300)  # the process's record
    monkeypatch.setattr(resident_memory, "reset_peak", lambda: False)
    outer = PeakWatch().start()  # sampling, as in a sandbox that denies the reset
    monkeypatch.undo()
    inner = PeakWatch().start()
    assert inner.reset
    _allocate(20, hold_s=0.1)
    inner.stop()
    _, outer_added = outer.stop()
    assert outer_added is not None and outer_added < 150


def _denied(*args: object, **kwargs: object) -> None:
    raise PermissionError("not yours")


def test_a_held_reset_works_where_the_file_cannot_be_opened_and_never_in_a_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resident_memory, "_held", None)
    if not resident_memory.hold_reset():
        pytest.skip("this process may not open its clear_refs")
    assert resident_memory._held is not None
    held_fd = resident_memory._held[1]
    try:
        _reset_through_the_held_descriptor(monkeypatch)
    finally:
        os.close(held_fd)


def _reset_through_the_held_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    _allocate(200)  # the process's record
    with monkeypatch.context() as patched:
        # As in the sandbox's job child once it left root: the path is not writable.
        patched.setattr("builtins.open", _denied)
        assert resident_memory.reset_peak() is True
        pid = os.fork()
        if pid == 0:  # the parent's descriptor names the parent: a fork must not use it
            code = 2
            try:
                code = 0 if resident_memory.reset_peak() is False else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    high, now = resident_memory.high_water(), resident_memory.resident()
    assert high is not None and now is not None
    assert high < now + 100 * MB  # the 200 MB record was reset


def test_free_memory_is_given_back_where_glibc_is() -> None:
    assert resident_memory.release_free_memory() is True


def test_each_stage_records_the_peak_of_what_it_freed(tmp_path: Path) -> None:
    request = ExportRequest(
        upload=Upload(model=tmp_path / "model.py"),
        options=ExportOptions(),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    run = ExportRun(request, None)
    before = resident_memory.resident()
    with run.step("loading", "allocating"):
        _allocate(150)
    [stage] = run.stages
    assert stage.name == "loading" and stage.status == "succeeded"
    assert stage.peak_rss_mb is not None and before is not None
    assert stage.peak_rss_mb >= before / MB + 140  # the allocation on top of the rest
