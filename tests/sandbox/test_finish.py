"""A job's result comes back once it said `done` and its outputs were taken: the job is
stopped then, and its slot, cgroups and staging directory are given back once its
processes are gone (supervisor.supervise, runner, exiting.py)."""

from __future__ import annotations

import time

from tests.sandbox.conftest import Arena, job_processes

FINISHED = {"code": None, "signal": None, "after_done": True}
"""`details.exit` of a job stopped once its outputs were taken."""
EXITED_FIRST = {"code": 0, "signal": None}
"""A job that exited by itself before the worker had taken its outputs (~10 ms race)."""


def test_the_result_comes_before_the_exit_and_the_job_is_gone_after(each_arena: Arena) -> None:
    arena = each_arena
    exits: list[object] = []
    for _ in range(5):  # until one job's exit lost the race to the worker, as usual
        result, _, job_dir = arena.run(arena.model("benign"))
        assert result.report.status == "succeeded", result.error
        assert result.report.sandbox is not None
        details = result.report.sandbox.details
        exits.append(details["exit"])
        assert details["exit"] in (FINISHED, EXITED_FIRST), details["exit"]
        assert details["roundtrips"]["loaders"] == 1  # from `finishing` or `exited`
        assert (job_dir / "out" / "program.pt2").is_file()
        assert arena.runner.wait_for_cleanup(30)
        assert job_processes() == []
        assert [p.name for p in arena.runner.jobs_root.glob("*-*-*")] == []  # staging gone
        if details["exit"] == FINISHED:
            break
    assert FINISHED in exits, exits


def test_a_job_that_says_done_and_runs_on_is_stopped(arena: Arena) -> None:
    started = time.monotonic()
    result, _, job_dir = arena.run(arena.model("early_done"), options={"timeout_s": 120})
    elapsed = time.monotonic() - started
    # Its own report, taken when it said done; it did not run to its timeout.
    assert result.error is not None and result.error.message == "EARLY-DONE"
    assert elapsed < 30
    assert result.report.sandbox is not None
    assert result.report.sandbox.details["exit"]["after_done"] is True
    # What it printed before `done` is in its log and the result's tail.
    assert "BEFORE-DONE" in result.stdout_tail
    assert "BEFORE-DONE" in (job_dir / "sandbox.log").read_text()
    assert arena.runner.wait_for_cleanup(30)
    assert job_processes() == []
