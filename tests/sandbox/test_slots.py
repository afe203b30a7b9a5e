"""Job slots are the machine's, not one runner's (issue: `torchport serve --workers 2`
ran both workers' jobs as uid 65534, so they shared RLIMIT_NPROC and everything else the
kernel keys by uid). A slot is an flock held for the job's life; a dead worker's slots
come free with its process."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from schemas import ExportOptions
from tests.sandbox.conftest import JOB_UID, Arena, fresh_runner
from tests.sandbox.test_neighbours import _model, _probe
from worker.sandbox import SandboxJob, SandboxResult
from worker.sandbox.host.slots import SlotLeases

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_slots_are_the_lowest_free_and_come_back(tmp_path: Path) -> None:
    leases = SlotLeases.open([tmp_path / "slots"])
    first, second = leases.take(), leases.take()  # two holders in one process
    assert (first.number, second.number) == (0, 1)
    leases.release(first)
    again = leases.take()
    assert again.number == 0
    leases.release(again)
    leases.release(second)


def test_a_slot_held_by_another_process_is_skipped_until_it_dies(tmp_path: Path) -> None:
    leases = SlotLeases.open([tmp_path / "slots"])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "slots" / "0.lock")],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        taken = leases.take()
        assert taken.number == 1
        leases.release(taken)
    finally:
        holder.kill()
        holder.wait()
    taken = leases.take()  # the kernel dropped the dead holder's lock
    assert taken.number == 0
    leases.release(taken)


def test_the_slot_directory_must_be_private(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    leases = SlotLeases.open([link, loose])
    assert leases.directory == loose  # the symlink was refused
    assert loose.stat().st_mode & 0o777 == 0o700
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, JOB_UID, JOB_UID)
        with pytest.raises(OSError):
            SlotLeases.open([foreign])


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs keep the worker's uid when it is not root")
def test_jobs_of_two_runners_never_share_a_uid(arena: Arena) -> None:
    root = Path(tempfile.mkdtemp(prefix="torchport-slots-", dir=arena.root))
    os.chmod(root, 0o755)
    results: list[SandboxResult] = []
    with fresh_runner(work_root=root / "work", spares=False) as other:

        def run_other() -> None:
            results.append(
                other.run(
                    SandboxJob(
                        model=_model(arena, "runner_b", victim=1, sleep_s=4.0),
                        inputs=None,
                        weights=None,
                        options=ExportOptions(timeout_s=60),
                        job_dir=root / "job-b",
                    )
                )
            )

        thread = threading.Thread(target=run_other)
        thread.start()
        time.sleep(0.5)
        result, _, _ = arena.run(_model(arena, "runner_a", victim=1, sleep_s=4.0))
        thread.join()
    uids = sorted([_probe(result)["uid"], _probe(results[0])["uid"]])
    assert uids == sorted([JOB_UID, arena.runner.settings.slot_uid_base + 1])
