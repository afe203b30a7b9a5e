"""Landlock's filesystem rules as a job gets them: what it may move, and where."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from worker.sandbox.confinement import landlock, lockdown

pytestmark = pytest.mark.skipif(landlock.abi_version() < 2, reason="FS_REFER needs ABI 2")


def _errno_in_child(work: Callable[[], None]) -> int:
    """0 when `work` ran in a forked child, else the errno of the OSError it raised."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            work()
        except OSError as exc:
            code = exc.errno or 255
        except BaseException:
            code = 254
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_files_move_between_a_jobs_own_directories_only(tmp_path: Path) -> None:
    read, out, scratch = (tmp_path / name for name in ("code", "out", "tmp"))
    for folder in (read, out / ".staged", scratch):
        folder.mkdir(parents=True)
    (read / "library.py").write_text("installed")

    def confined(move: Callable[[], None]) -> Callable[[], None]:
        def work() -> None:
            lockdown.prctl(lockdown.PR_SET_NO_NEW_PRIVS, 1)
            landlock.restrict([read], [out, scratch])
            move()

        return work

    def staged_then_renamed() -> None:  # onnx_ir's external data, written beside
        (out / ".staged" / "model.onnx.data").write_bytes(b"weights")
        os.replace(out / ".staged" / "model.onnx.data", out / "model.onnx.data")
        (scratch / "x").write_bytes(b"x")
        os.replace(scratch / "x", out / "x")

    assert _errno_in_child(confined(staged_then_renamed)) == 0
    assert (out / "model.onnx.data").read_bytes() == b"weights"
    assert (out / "x").read_bytes() == b"x"
    # Nothing read-only moves into the job's directories, nor anything out of them.
    refused = (errno.EXDEV, errno.EACCES, errno.EPERM)
    link_in = confined(lambda: os.link(read / "library.py", out / "library.py"))
    move_in = confined(lambda: os.replace(read / "library.py", out / "library.py"))
    move_out = confined(lambda: os.replace(out / "x", read / "x"))
    assert _errno_in_child(link_in) in refused
    assert _errno_in_child(move_in) in refused
    assert _errno_in_child(move_out) in refused
    assert (read / "library.py").read_text() == "installed"
    assert not (out / "library.py").exists() and not (read / "x").exists()
