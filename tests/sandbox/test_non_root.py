"""The sandbox when the worker itself is not root (as in a pod with runAsNonRoot).

The worker runs in a fresh user namespace: uid 65534 inside, no capabilities, so it
cannot change uid and the `uid` layer is absent. Landlock and seccomp must still hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import CANARY, Arena

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
from pathlib import Path
from worker.sandbox import SandboxJob, SandboxRunner, SandboxSettings
work, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
out = {"uid": __import__("os").getuid(), "jobs": {}}
# Each job twice: handed to a ready spare, then by a runner without spares (a fresh fork).
for mode, spares in (("spare", True), ("fresh", False)):
    with SandboxRunner(SandboxSettings(work_root=work / mode, spares=spares)) as runner:
        for name, model in jobs.items():
            if spares:
                assert runner.wait_for_spares(120)
            job_dir = work.parent / ("job-" + mode + "-" + name)
            result = runner.run(SandboxJob(model=Path(model), inputs=None, weights=None,
                                           options={}, job_dir=job_dir))
            out["jobs"][mode + "-" + name] = {
                "status": result.report.status,
                "code": result.error.code if result.error else None,
                "layers": result.report.sandbox.layers if result.report.sandbox else [],
                "spare": result.report.sandbox.details.get("spare"),
                "returned": result.report.model_dump_json() + result.stdout_tail,
            }
print(json.dumps(out))
"""


def test_a_non_root_worker_still_confines_jobs(arena: Arena, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test makes a non-root worker from root with a user namespace")
    jobs = {name: str(arena.model(name)) for name in ("network", "secrets", "exec", "benign")}
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
    for mode in ("spare", "fresh"):
        assert seen["jobs"][f"{mode}-network"]["code"] == "sandbox_violation"
        assert seen["jobs"][f"{mode}-exec"]["status"] == "succeeded"
        assert seen["jobs"][f"{mode}-benign"]["status"] == "succeeded"
    assert arena.listeners.received == []
    assert sorted(os.listdir(arena.marker_dir)) == []
