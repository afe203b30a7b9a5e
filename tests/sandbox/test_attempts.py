"""The job child's record of forbidden actions the upload tried (`child._Attempts`).

Audit hooks cannot be removed, so each case runs in its own interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from schemas import ReportWarning
from tests.sandbox.conftest import Arena
from worker.sandbox import SandboxResult

UPLOAD = """
import os, socket, subprocess

def try_socket():
    try:
        socket.socket()
    except OSError:
        pass

def try_exec():
    try:
        subprocess.run(["/bin/true"])
    except OSError:
        pass
"""

DRIVER = """
import json, socket, sys, builtins
from pathlib import Path
from worker.sandbox.child.run import _Attempts

attempts = _Attempts([Path(sys.argv[1])])
sys.addaudithook(attempts.hook)
socket.socket().close()          # not from the upload: not counted
for _ in range(1000):
    id(attempts)                 # an event torch raises by the ten thousand
sys.path.insert(0, sys.argv[1])
import upload
before = dict(attempts.seen)
upload.try_socket()
upload.try_exec()
print(json.dumps({
    "before": before,
    "after": attempts.seen,
    "hook": type(attempts.hook).__name__,
}))
"""


def test_only_the_uploads_own_forbidden_actions_are_recorded(tmp_path: Path) -> None:
    upload_dir = tmp_path / "in"
    upload_dir.mkdir()
    (upload_dir / "upload.py").write_text(UPLOAD)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(upload_dir)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == {}
    assert sorted(seen["after"]) == ["socket.__new__", "subprocess.Popen"]
    # The hook itself is C code: Python runs only for the forbidden events' tripwires.
    assert seen["hook"] == "builtin_function_or_method"


LIBRARY_DRIVER = """
import json, socket, sys
from pathlib import Path
from worker.sandbox.child.run import _Attempts, denied_warning

attempts = _Attempts([Path(sys.argv[1])])
sys.addaudithook(attempts.hook)
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import upload
upload.probe(own=sys.argv[3] == "own")
print(json.dumps(denied_warning(attempts).details))
"""

LIBRARY = """
import socket

def has_ipv6():
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pass
"""

PROBING_UPLOAD = """
import socket
import probe_lib

def probe(own):
    probe_lib.has_ipv6()
    if own:
        try:
            socket.socket().close()
        except OSError:
            pass
"""


def _denied_details(tmp_path: Path, own: bool) -> dict[str, object]:
    upload_dir, packages = tmp_path / "in", tmp_path / "venv" / "site-packages"
    (packages / "probe_lib").mkdir(parents=True)
    upload_dir.mkdir()
    (packages / "probe_lib" / "__init__.py").write_text(LIBRARY)
    (upload_dir / "upload.py").write_text(PROBING_UPLOAD)
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY_DRIVER, str(upload_dir), str(packages), "own" * own],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_socket_only_a_library_opened_is_reported_as_the_librarys(tmp_path: Path) -> None:
    details = _denied_details(tmp_path, own=False)
    assert details == {
        "attempted": ["socket.__new__"],
        "by_libraries": ["socket.__new__"],
        "by_library": True,
        "libraries": ["probe_lib"],
    }


def test_the_uploads_own_attempt_beside_a_librarys_is_not_by_library(tmp_path: Path) -> None:
    details = _denied_details(tmp_path, own=True)
    assert details["by_library"] is False
    assert details["libraries"] == ["probe_lib"]
    assert details["attempted"] == ["socket.__new__"]


MODELS = Path(__file__).resolve().parents[1] / "models"


def _warning(result: SandboxResult, code: str) -> ReportWarning:
    found = [w for w in result.report.warnings if w.code == code]
    assert len(found) == 1, result.report.warnings
    return found[0]


def test_a_library_probe_is_a_warning_and_the_real_failure_the_outcome(arena: Arena) -> None:
    result, _, _ = arena.run(MODELS / "attempt_library_probe.py")
    assert result.error is not None
    assert result.error.code == "verification_failed"
    warning = _warning(result, "sandbox_denied")
    assert warning.details["by_libraries"] == ["socket.__new__"]
    assert warning.details["by_library"] is True
    assert warning.details["libraries"] == ["urllib3"]


def test_a_library_probe_in_a_job_that_succeeds_is_a_warning(arena: Arena, tmp_path: Path) -> None:
    model = tmp_path / "probe_ok.py"
    model.write_text((MODELS / "attempt_library_probe.py").read_text().replace("= True", "= False"))
    os.chmod(tmp_path, 0o755)
    result, _, _ = arena.run(model)
    assert result.error is None, result.error
    assert result.report.status == "succeeded"
    assert _warning(result, "sandbox_denied").details["attempted"] == ["socket.__new__"]


def test_an_attempt_survived_in_an_earlier_stage_is_a_warning(arena: Arena) -> None:
    result, _, _ = arena.run(MODELS / "attempt_own_survived.py")
    assert result.error is not None
    assert result.error.code == "verification_failed"
    warning = _warning(result, "sandbox_denied")
    assert warning.details["attempted"] == ["socket.__new__"]
    assert warning.details["by_libraries"] == []
    assert warning.details["by_library"] is False
