"""A job cannot act on other processes, whatever their uid: another tenant's running job,
the worker (issue: a job set another job's RLIMIT_CPU to 1 s and killed it). seccomp
refuses prlimit64 and sched_setaffinity on any pid but the job's own, setpriority,
inotify, and changing any file's mode, times or extended attributes (a non-root worker's
job shares the user's uid); concurrent jobs of a root worker never share a uid."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from schemas import ExportOptions
from tests.sandbox.conftest import JOB_UID, MODELS, Arena, fresh_runner
from worker.sandbox import SandboxJob, SandboxResult

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs a victim of another uid")


def _probe(result: SandboxResult) -> dict[str, Any]:
    assert result.error is not None
    text = result.error.message + str(result.error.details.get("original_message", ""))
    found = re.search(r"PROBE(\{.*?\})PROBE", text)
    assert found is not None, result.error
    return json.loads(found.group(1))


def _model(arena: Arena, name: str, victim: int, sleep_s: float = 0.0) -> Path:
    text = (MODELS / "hostile_neighbours.py").read_text()
    text = text.replace("TARGETS = {}", f"TARGETS = {{'victim_pid': {victim}}}")
    text = text.replace("SLEEP_S = 0.0", f"SLEEP_S = {sleep_s}")
    path = arena.root / f"{name}.py"
    path.write_text(text)
    return path


def _cpu_limit(pid: int) -> str:
    """The "Max cpu time" line of /proc/PID/limits (prlimit on another uid's process
    needs CAP_SYS_RESOURCE, which root lacks on some hosts)."""
    with open(f"/proc/{pid}/limits") as handle:
        return next(line for line in handle if line.startswith("Max cpu time"))


@root_only
def test_a_job_cannot_touch_a_process_of_its_own_uid(arena: Arena) -> None:
    victim = subprocess.Popen(["sleep", "300"], user=JOB_UID, group=JOB_UID)
    try:
        limit_before = _cpu_limit(victim.pid)
        nice_before = os.getpriority(os.PRIO_PROCESS, victim.pid)
        affinity_before = os.sched_getaffinity(victim.pid)
        result, _, _ = arena.run(_model(arena, "neighbours", victim.pid))
        seen = _probe(result)
        assert seen["uid"] == JOB_UID  # the victim's uid: only the sandbox stands between
        assert seen["prlimit_other"] == errno.EPERM
        assert seen["setpriority_other"] == errno.EPERM
        assert seen["affinity_other"] == errno.EPERM
        assert seen["inotify"] == errno.EPERM
        assert seen["prlimit_self"] == 0  # its own limits stay readable
        assert seen["chmod"] == errno.EPERM  # of its own file: only seccomp says no
        assert seen["utime"] == errno.EPERM
        assert seen["setxattr"] == errno.EPERM
        assert _cpu_limit(victim.pid) == limit_before
        assert os.getpriority(os.PRIO_PROCESS, victim.pid) == nice_before
        assert os.sched_getaffinity(victim.pid) == affinity_before
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@root_only
def test_concurrent_jobs_get_uids_of_their_own(arena: Arena) -> None:
    results: list[SandboxResult] = []

    def run(name: str) -> None:
        result, _, _ = arena.run(_model(arena, name, victim=1, sleep_s=4.0))
        results.append(result)

    assert arena.runner.wait_for_cleanup(30)  # the jobs before have exited: slots free
    threads = [threading.Thread(target=run, args=(f"slot{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    uids = sorted(_probe(r)["uid"] for r in results)
    settings = arena.runner.settings
    assert uids == sorted([JOB_UID, settings.slot_uid_base + 1])
    # Slot uids are freed once their jobs are gone: the next job alone runs as the first
    # slot's uid again.
    assert arena.runner.wait_for_cleanup(30)
    result, _, _ = arena.run(_model(arena, "alone", victim=1))
    assert _probe(result)["uid"] == JOB_UID


@root_only
def test_a_job_gets_a_pids_cgroup_of_its_own(arena: Arena) -> None:
    from worker.sandbox.confinement import cgroups

    if cgroups.JobGroups.open() is None:  # pragma: no cover - depends on the host
        pytest.skip("no writable pids cgroup hierarchy on this host")
    with fresh_runner(pids_max=200, spares=False, work_root=arena.root / "pids") as runner:
        assert runner._resources.groups  # pids, and memory where the host has a v1 hierarchy
        parents = [group.parent for group in runner._resources.groups]
        result = runner.run(
            SandboxJob(
                model=MODELS / "hostile_threads.py",
                inputs=None,
                weights=None,
                options=ExportOptions(timeout_s=60),
                job_dir=arena.root / "pids-job",
            )
        )
        seen = _probe(result)
        assert result.report.sandbox is not None
        assert result.report.sandbox.details["in_force"]["pids_max"] == 200
        assert 100 < seen["threads"] < 200  # the group's limit, not the uid's 4096
        if len(parents) > 1:  # the memory group's limit is in force in the job too
            assert result.report.sandbox.details["in_force"]["memory_max_mb"] > 0
        assert runner.wait_for_cleanup(30)  # the job's processes are gone, then its group
        for parent in parents:
            assert [p.name for p in parent.glob("job-*")] == []  # removed with the job
        benign, _, _ = arena.run(arena.model("benign"))  # the arena's jobs start threads
        assert benign.report.status == "succeeded"
    assert not any(parent.exists() for parent in parents)


@root_only
def test_groups_of_a_killed_runner_are_removed_by_the_next() -> None:
    from worker.sandbox.confinement import cgroups

    groups = cgroups.JobGroups.open()
    if groups is None:  # pragma: no cover - depends on the host
        pytest.skip("no writable pids cgroup hierarchy on this host")
    groups.close()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    stale = groups.parent.with_name(f"torchport-{dead.pid}-deadbeef")
    (stale / "job-x").mkdir(parents=True)
    fresh = cgroups.JobGroups.open()
    assert fresh is not None
    fresh.close()
    assert not stale.exists()


@root_only
@pytest.mark.parametrize("threads", [0, 3])
def test_joining_a_job_group_moves_every_thread(threads: int) -> None:
    """A single-threaded child joins through v1's `tasks` (no global lock: 0.3 ms, not
    5-20 ms); one with threads through `cgroup.procs`. Either way every thread of the
    process, and what it starts afterwards, is in the job's group."""
    from worker.sandbox.confinement import cgroups

    groups = cgroups.JobGroups.open()
    if groups is None:  # pragma: no cover - depends on the host
        pytest.skip("no writable pids cgroup hierarchy on this host")
    try:
        group = groups.create("join-test", 64)
        assert group is not None
        ours = f"/{group.parent.name}/{group.name}"
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                release = threading.Event()
                started = [threading.Thread(target=release.wait) for _ in range(threads)]
                for thread in started:
                    thread.start()
                pids_max = cgroups.join(group)
                late = threading.Thread(target=release.wait)
                late.start()
                seen = {}
                for tid in os.listdir("/proc/self/task"):
                    with open(f"/proc/self/task/{tid}/cgroup") as handle:
                        lines = [x.strip().split(":", 2) for x in handle]
                    # v1: the pids hierarchy's line; v2: the one line of the unified one
                    pids = [x[2] for x in lines if "pids" in x[1].split(",")]
                    seen[tid] = (pids or [x[2] for x in lines if x[1] == ""])[0]
                release.set()
                os.write(write, json.dumps({"max": pids_max, "seen": seen}).encode())
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        report = json.loads(os.read(read, 1 << 16))
        os.close(read)
        assert os.WIFEXITED(status)
        assert report["max"] == 64
        assert len(report["seen"]) == threads + 2  # the main thread, `threads`, a late one
        assert all(path.endswith(ours) for path in report["seen"].values()), report
    finally:
        groups.close()
