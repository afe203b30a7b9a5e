"""Jobs import everything the worker's environment has, even when Python lives under a
directory the job uid cannot traverse (pyenv in root's 0700 home): the zygote's private
mount view without bubblewrap, bubblewrap's binds with it
(worker/sandbox/confinement/mountview.py)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import ExportOptions
from tests.sandbox.conftest import JOB_UID, fresh_runner
from worker.sandbox import SandboxJob
from worker.sandbox.confinement import mountview

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="jobs keep the worker's uid")


@pytest.fixture
def private_tree() -> Iterator[Path]:
    """`<tmp>/home` (0700, root's) holding `lib/pkg/mod.py` (world-readable)."""
    top = Path(tempfile.mkdtemp(prefix="torchport-view-"))
    os.chmod(top, 0o755)
    home = top / "home"
    (home / "lib" / "pkg").mkdir(parents=True)
    (home / "lib" / "pkg" / "mod.py").write_text("VALUE = 42\n")
    (home / "secret.txt").write_text("secret")
    for path in (home / "lib", home / "lib" / "pkg"):
        os.chmod(path, 0o755)
    os.chmod(home / "lib" / "pkg" / "mod.py", 0o644)
    os.chmod(home / "secret.txt", 0o644)
    os.chmod(home, 0o700)
    yield home
    shutil.rmtree(top, ignore_errors=True)


def test_blocking_finds_the_outermost_private_ancestor(private_tree: Path) -> None:
    lib = private_tree / "lib" / "pkg"
    assert mountview.blocking([lib], JOB_UID, JOB_UID) == [private_tree]
    os.chmod(private_tree, 0o711)
    assert mountview.blocking([lib], JOB_UID, JOB_UID) == []


def _in_child(work: object) -> int:
    """Run `work()` in a forked child; its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 99
        try:
            code = int(work())  # type: ignore[operator]
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@root_only
def test_the_view_lets_the_job_uid_read_code_and_nothing_else(private_tree: Path) -> None:
    lib = private_tree / "lib"
    scratch = Path(tempfile.mkdtemp(prefix="torchport-view-jobs-", dir=private_tree))
    os.chmod(scratch, 0o777)

    def as_job_uid(build: bool) -> int:
        if build:
            assert mountview.build([lib], [scratch], JOB_UID, JOB_UID) == [str(private_tree)]
        os.setgroups([])
        os.setgid(JOB_UID)
        os.setuid(JOB_UID)
        try:
            value = (lib / "pkg" / "mod.py").read_text()
        except PermissionError:
            return 1
        assert value == "VALUE = 42\n"
        assert not (private_tree / "secret.txt").exists()  # hidden by the view
        (scratch / "written").write_text("ok")  # the staging root stays writable
        try:
            (lib / "pkg" / "new.py").write_text("")
        except OSError:
            return 0  # code is read-only
        return 2

    assert _in_child(lambda: as_job_uid(build=False)) == 1
    assert _in_child(lambda: as_job_uid(build=True)) == 0
    assert (scratch / "written").read_text() == "ok"  # the host sees the job's write
    assert (private_tree / "secret.txt").exists()  # the host's view is unchanged


@root_only
def test_unreadable_names_the_path(private_tree: Path) -> None:
    lib = str(private_tree / "lib")
    assert mountview.unreadable([lib, "/usr"], JOB_UID, JOB_UID) == [f"{lib} (Permission denied)"]


IMPORTS = """\
import torch
import http.cookiejar  # not imported by the zygote: read from the standard library
import encodings.cp437  # what opening a zip upload needs
import xml.dom.minidom


class Model(torch.nn.Module):
    def forward(self, x):
        return x + len(http.cookiejar.__name__)


model = Model()
example_args = (torch.ones(2),)
"""


def _stdlib_hidden() -> bool:
    return bool(mountview.blocking([Path(sys.base_prefix)], JOB_UID, JOB_UID))


@root_only
@pytest.mark.parametrize("bwrap", [False, True], ids=["without-bwrap", "with-bwrap"])
def test_jobs_import_unloaded_stdlib_modules(bwrap: bool, tmp_path: Path) -> None:
    if bwrap and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/test.sh installs it)")
    os.chmod(tmp_path, 0o755)
    model = tmp_path / "model.py"
    model.write_text(IMPORTS)
    runner = fresh_runner(use_bwrap=bwrap, spares=False, work_root=tmp_path / "work").start()
    try:
        result = runner.run(
            SandboxJob(
                model=model,
                inputs=None,
                weights=None,
                options=ExportOptions(),
                job_dir=tmp_path / "job",
            )
        )
    finally:
        runner.close()
    assert result.error is None, result.error
    assert result.report.status == "succeeded"
    assert result.report.sandbox is not None
    assert ("bwrap" in result.report.sandbox.layers) is bwrap
    view = result.report.sandbox.details.get("mount_view")
    if bwrap:
        assert view is None  # bubblewrap's own binds do it
    elif _stdlib_hidden():  # pyenv in root's home, as on this project's machines
        assert view is not None
        assert any(Path(sys.base_prefix).is_relative_to(covered) for covered in view)
