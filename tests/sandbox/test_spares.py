"""The zygote's spares: a pre-forked child that warmed itself up while the worker was
idle and is handed the next job (zygote.py). Their confinement is checked by running
the hostile suite and the layer probes through them (`each_arena`); here: their life.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from tests.sandbox.conftest import (
    SPARE_WAIT_S,
    Arena,
    digest,
    fresh_runner,
    job_processes,
    run_benign,
)
from worker.sandbox import SandboxResult


def test_a_job_at_an_idle_worker_runs_in_a_warm_spare(spare_arena: Arena) -> None:
    result, _, _ = spare_arena.run(spare_arena.model("benign"))
    assert result.report.status == "succeeded", result.error
    assert result.report.sandbox is not None
    details = result.report.sandbox.details
    assert details["spare"] is True
    # The round trip was handed to the spare loader, also locked down before it loaded.
    assert details["roundtrips"] == {"loaders": 1, "in_spares": 1}
    assert result.report.verification is not None
    assert result.report.verification.roundtrip is not None
    assert result.report.verification.roundtrip.status == "passed"
    # The child lists no artifacts (digest_artifacts=False); the worker hashes the files
    # it accepted and lists them, report included.
    listed = {a.name: (a.size, a.sha256) for a in result.report.artifacts}
    assert set(listed) == {"program.pt2", "graph.json", "signature.json"}
    for name, (size, sha) in listed.items():
        path = result.artifacts[name]
        assert (path.stat().st_size, digest(path)) == (size, sha)


def test_work_right_after_work_runs_in_the_spares_successor(spare_arena: Arena) -> None:
    runner = spare_arena.runner
    first, _, _ = spare_arena.run(spare_arena.model("benign"))  # waits, runs in the spare
    assert first.report.sandbox is not None and first.report.sandbox.details["spare"] is True
    # The next job comes at once. Once the first decomposed (a stage on one core), the
    # zygote forked its spare's successor, which only faulted in learned pages: ready.
    second = run_benign(runner, spare_arena, "back-to-back")
    assert second.report.status == "succeeded", second.error
    assert second.report.sandbox is not None
    details = second.report.sandbox.details
    assert (details["spare"], details["prefault"]) == (True, False)
    assert details["roundtrips"] == {"loaders": 1, "in_spares": 1}
    # Exactly one spare of each kind is ready again.
    assert runner.wait_for_spares(SPARE_WAIT_S)
    assert len(runner.zygote_children()) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="finds the job child by its uid")
def test_a_successor_is_forked_once_the_job_decomposes_not_while_it_loads(
    spare_arena: Arena,
) -> None:
    runner = spare_arena.runner
    assert runner.wait_for_cleanup(30)  # no earlier job is still exiting
    assert runner.wait_for_spares(SPARE_WAIT_S)
    spares = set(runner.zygote_children())
    finished: list[SandboxResult] = []
    job = threading.Thread(
        target=lambda: finished.append(spare_arena.run(spare_arena.model("peak_probe"))[0])
    )
    job.start()
    try:
        deadline = time.monotonic() + 60
        running: list[int] = []
        while not running and time.monotonic() < deadline:
            running = [pid for pid in spares if pid in job_processes()]  # the spare, now the job
            time.sleep(0.01)
        # The job child is locked down and loading (its model sleeps 2 s there): the
        # zygote's children are the job child and the spare loader, no successor yet.
        loading = runner.zygote_children()
        assert running, "the job never started"
        assert job.is_alive()
    finally:
        job.join()
    assert len(loading) == 2, loading
    assert finished and finished[0].report.status == "succeeded", finished[0].error
    assert finished[0].report.sandbox is not None
    assert finished[0].report.sandbox.details["spare"] is True
    assert runner.wait_for_spares(SPARE_WAIT_S)
    assert len(runner.zygote_children()) == 2


def test_work_never_waits_for_a_spare_still_warming(spare_arena: Arena) -> None:
    runner = spare_arena.runner
    assert runner.wait_for_spares(SPARE_WAIT_S)
    results: list[SandboxResult] = []
    jobs = [
        threading.Thread(target=lambda n=n: results.append(run_benign(runner, spare_arena, n)))
        for n in ("together-1", "together-2")
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    details = []
    for result in results:
        assert result.report.status == "succeeded", result.error
        assert result.report.sandbox is not None
        details.append(result.report.sandbox.details)
    # One takes the ready spare. The other finds no spare (the successor is owed until
    # the first decomposes): it gets a fresh fork that faults the learned pages in itself
    # before its lockdown (pages.py), and the successor is forked then; or, when it came
    # later, it waits for that successor still faulting in its pages (spares.take).
    assert sorted(d["spare"] for d in details) in ([False, True], [True, True])
    for each in details:
        assert each["prefault"] is not each["spare"]
    assert runner.wait_for_spares(SPARE_WAIT_S)
    assert len(runner.zygote_children()) == 2


SLEEPER = """
import os
import tempfile
import time
import torch
eager = []
class Sleeper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
    def forward(self, x):
        if not torch.compiler.is_exporting():
            eager.append(1)
            if len(eager) > 1:  # verifying, after decomposing forked the successor
                # holds the marker open until the test writes to it (at most 60 s)
                with tempfile.NamedTemporaryFile(prefix="sleeper-marker-") as marker:
                    deadline = time.monotonic() + 60
                    while os.fstat(marker.fileno()).st_size == 0:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.05)
        return self.linear(x)
model = Sleeper()
example_args = (torch.randn(2, 4),)
"""


def _release_sleeper(deadline: float) -> bool:
    """Write to the marker the sleeping job holds open (through /proc: the job's own
    tmp); False when no job process held one before the deadline."""
    while time.monotonic() < deadline:
        for pid in job_processes():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = f"/proc/{pid}/fd/{fd}"
                    if "sleeper-marker-" in os.readlink(link):
                        with open(link, "ab") as marker:
                            marker.write(b"go")
                        return True
        time.sleep(0.05)
    return False


def test_a_spare_made_beside_a_job_holds_none_of_its_descriptors(
    spare_arena: Arena,
) -> None:
    runner = spare_arena.runner
    assert runner.wait_for_spares(SPARE_WAIT_S)
    before = set(runner.zygote_children())
    model = spare_arena.root / f"sleeper-{os.getpid()}.py"
    model.write_text(SLEEPER)
    done: list[SandboxResult] = []
    job = threading.Thread(target=lambda: done.append(spare_arena.run(model)[0]))
    job.start()
    try:
        deadline = time.monotonic() + 10
        successors: set[int] = set()
        while not successors and time.monotonic() < deadline:
            successors = set(runner.zygote_children()) - before
            time.sleep(0.02)
        [successor] = successors
        # ready: past its start, where it closes what it inherited
        assert runner.wait_for_spares(SPARE_WAIT_S)
        held = {
            int(fd): os.readlink(f"/proc/{successor}/fd/{fd}")
            for fd in os.listdir(f"/proc/{successor}/fd")
        }
        # the job, verifying, still holds its pipes: it waits for the test's word
        assert _release_sleeper(time.monotonic() + 60)
    finally:
        job.join()
    beyond = {fd: target for fd, target in held.items() if fd > 2}
    # its socket to the zygote, nothing of the job's (progress, output, round-trip pipes)
    assert len(beyond) == 1 and next(iter(beyond.values())).startswith("socket:"), held
    assert done[0].report.status == "succeeded", done[0].error


def test_spares_warming_up_the_slow_way_are_killed_for_work(arena: Arena) -> None:
    with fresh_runner() as runner:
        # At once after the start, nothing is learned yet: the first spares run the
        # whole-pipeline warm-up (~700 ms), which would share the CPU with the job.
        job = run_benign(runner, arena, "first")
        assert job.report.status == "succeeded", job.error
        assert job.report.sandbox is not None
        details = job.report.sandbox.details
        assert (details["spare"], details["prefault"]) == (False, False)
        assert details["roundtrips"] == {"loaders": 1, "in_spares": 0}
        # Made again once the job ended; they learn their pages.
        assert runner.wait_for_spares(SPARE_WAIT_S)
        assert len(runner.zygote_children()) == 2
        assert set(runner.learned_pages()) == {"job", "loader"}


def test_the_first_spares_learn_the_pages_their_warm_up_touched(spare_arena: Arena) -> None:
    runner = spare_arena.runner
    assert runner.wait_for_spares(SPARE_WAIT_S)
    learned = runner.learned_pages()
    # Copied on write (the zygote's heap) and mapped (torch's code): thousands of pages
    # each for a job's warm-up; later spares fault them in instead of warming up.
    assert learned["job"]["write"] > 2000 and learned["job"]["read"] > 2000, learned
    assert learned["loader"]["write"] > 500 and learned["loader"]["read"] > 500, learned
    # The ranges went through a file in the warm-up directory, removed once read.
    assert list((runner.jobs_root / ".warm").glob("pages-*")) == []
    result, _, _ = spare_arena.run(spare_arena.model("benign"))  # a later, prefaulted spare
    assert result.report.status == "succeeded", result.error


def test_spares_that_keep_dying_are_given_up_and_jobs_still_run(arena: Arena) -> None:
    with fresh_runner() as runner:
        assert runner.wait_for_spares(SPARE_WAIT_S)
        assert runner.work_root is not None
        # Every spare is killed before it gets ready (the worker is idle: each of the
        # zygote's children is a spare), until the zygote gives up on them.
        log = runner.work_root / "zygote.log"
        deadline = time.monotonic() + 30
        while "jobs get fresh forks from now on" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the zygote kept making spares"
            for pid in runner.zygote_children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        assert runner.wait_for_spares(1.0) is False
        job = run_benign(runner, arena, "after")
        assert job.report.status == "succeeded", job.error
        assert job.report.sandbox is not None
        assert job.report.sandbox.details["spare"] is False
        assert runner.restarts == 0
