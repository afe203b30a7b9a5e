"""The sandbox when the worker itself is not root (as in a pod with runAsNonRoot).

The worker runs in a fresh user namespace: uid 65534 inside, no capabilities, so it
cannot change uid and the `uid` layer is absent. Landlock and seccomp must still hold.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import CANARY, MODELS, Arena

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, os, resource, sys
from pathlib import Path
from schemas import ExportOptions
from worker.sandbox import SandboxJob, SandboxRunner, SandboxSettings
work, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
# The job's victim is this worker process itself: the same uid, as in a runAsNonRoot pod.
own_file = work.parent / "users-file"
own_file.write_text("private")
os.chmod(own_file, 0o600)
neighbours = Path(jobs["neighbours"])
targets = {"victim_pid": os.getpid(), "users_file": str(own_file)}
neighbours.write_text(neighbours.read_text().replace("TARGETS = {}", "TARGETS = " + repr(targets)))
before = resource.getrlimit(resource.RLIMIT_CPU), os.getpriority(os.PRIO_PROCESS, 0)
out = {"uid": os.getuid(), "jobs": {}}
# Each job twice: handed to a ready spare, then by a runner without spares (a fresh fork).
for mode, spares in (("spare", True), ("fresh", False)):
    settings = SandboxSettings(work_root=work / mode, spares=spares, disk_mb=64, fsize_mb=32)
    with SandboxRunner(settings) as runner:
        for name, model in jobs.items():
            if spares:
                assert runner.wait_for_spares(120)
            job_dir = work.parent / ("job-" + mode + "-" + name)
            result = runner.run(SandboxJob(model=Path(model), inputs=None, weights=None,
                                           options=ExportOptions(), job_dir=job_dir))
            out["jobs"][mode + "-" + name] = {
                "status": result.report.status,
                "code": result.error.code if result.error else None,
                "layers": result.report.sandbox.layers if result.report.sandbox else [],
                "spare": result.report.sandbox.details.get("spare"),
                "returned": result.report.model_dump_json() + result.stdout_tail,
            }
after = resource.getrlimit(resource.RLIMIT_CPU), os.getpriority(os.PRIO_PROCESS, 0)
out["worker_limits_unchanged"] = before == after
out["users_file_mode"] = oct(own_file.stat().st_mode & 0o777)
print(json.dumps(out))
"""


def test_a_non_root_worker_still_confines_jobs(arena: Arena, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test makes a non-root worker from root with a user namespace")
    names = ("network", "secrets", "exec", "benign", "quota")
    jobs = {name: str(arena.model(name)) for name in names}
    neighbours = tmp_path / "uploads" / "neighbours.py"  # its targets: the worker's, below
    neighbours.parent.mkdir()
    neighbours.write_text((MODELS / "hostile_neighbours.py").read_text())
    jobs["neighbours"] = str(neighbours)
    quota = Path(jobs["quota"])  # five 30 MiB files: over the 64 MiB quota below
    quota.write_text(quota.read_text().replace('MODE = "many_files"', 'MODE = "big_files"'))
    os.chmod(tmp_path, 0o777)
    for path in jobs.values():
        os.chmod(Path(path).parent, 0o755)
    result = subprocess.run(
        [
            "unshare",
            "--user",
            sys.executable,
            "-c",
            SCRIPT,
            str(tmp_path / "work"),
            json.dumps(jobs),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["uid"] == 65534
    assert len(seen["jobs"]) == 2 * len(jobs)
    for key, job in seen["jobs"].items():
        assert {"landlock", "seccomp", "rlimits", "no_new_privs"} <= set(job["layers"])
        assert "uid" not in job["layers"]
        assert CANARY not in job["returned"]
        assert job["spare"] is key.startswith("spare-")
    # The jobs share the worker's uid: only seccomp keeps them off the worker.
    assert seen["worker_limits_unchanged"] is True
    assert seen["users_file_mode"] == "0o600"
    for mode in ("spare", "fresh"):
        probe = re.search(r"PROBE(\{.*?\})PROBE", seen["jobs"][f"{mode}-neighbours"]["returned"])
        assert probe is not None
        attempts = json.loads(probe.group(1).replace('\\"', '"'))
        assert attempts["uid"] == 65534  # the worker's own uid
        calls = ("prlimit_other", "setpriority_other", "affinity_other", "inotify", "chmod")
        for call in (*calls, "chmod_users_file"):
            assert attempts[call] == errno.EPERM, call
        assert seen["jobs"][f"{mode}-quota"]["code"] == "disk_quota_exceeded"
        assert seen["jobs"][f"{mode}-network"]["code"] == "sandbox_violation"
        assert seen["jobs"][f"{mode}-exec"]["status"] == "succeeded"
        assert seen["jobs"][f"{mode}-benign"]["status"] == "succeeded"
    assert arena.listeners.received == []
    assert sorted(os.listdir(arena.marker_dir)) == []
