"""What a job converting to `aoti` gets from the toolchain broker, judged by effect: the
broker's templates load no library of the job's (round 4's `-fcompare-debug=-B.` and
linker-plugin attack), and nothing a toolchain program starts outlives it, escapes the
job's memory limit, or is left when the job's uid goes to the next job."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox.conftest import fresh_runner, job_uids, run_upload
from worker.sandbox import SandboxResult, SandboxRunner
from worker.sandbox.confinement import converters
from worker.sandbox.host import runner as runner_mod
from worker.sandbox.host.tree import scan

needs_compiler = pytest.mark.skipif(
    not converters.programs(["aoti"]), reason="no C++ compiler on this machine"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="jobs get uids of their own as root")

LINGERER = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  if (fork() == 0) {
    size_t size = (size_t)MB << 20;
    char *held = malloc(size);
    if (held) memset(held, 1, size);
    sleep(120);
    return 0;
  }
  sleep(PARENT_S);
  return 0;
}
"""


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="torchport-toolchain-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(runner: SandboxRunner, model: str, options: dict[str, object]) -> SandboxResult:
    return run_upload(runner, model, options)


@pytest.mark.slow
@needs_compiler
def test_the_toolchain_loads_no_library_of_the_jobs(root: Path) -> None:
    with fresh_runner(work_root=root / "work-escape", spares=False) as runner:
        result = _run(
            runner, "hostile_toolchain.py", {"targets": ["aoti"], "verify": {"samples": 0}}
        )
        assert result.error is None, result.error  # the upload raises ESCAPED otherwise
        assert result.report.targets["aoti"].status == "succeeded"
        runner.wait_for_cleanup(30)
        assert not _leftovers(runner, "sh") and not _leftovers(runner, "sleep")


def _lingerer(runner: SandboxRunner, name: str, mb: int, parent_s: int) -> Path:
    """The stand-in compiler, in a directory the zygote sees (inside bubblewrap too)."""
    folder = runner.jobs_root / "bin"
    folder.mkdir(mode=0o755, exist_ok=True)
    source = folder / f"{name}.c"
    source.write_text(LINGERER.replace("MB", str(mb)).replace("PARENT_S", str(parent_s)))
    binary = folder / name
    subprocess.run(["gcc", "-O0", str(source), "-o", str(binary)], check=True)
    os.chmod(binary, 0o755)
    return binary


@pytest.fixture()
def fake_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Make the broker's `g++` whatever program the test puts in the list."""
    chosen: list[Path] = []
    loader = [p for p in converters.programs(["aoti"]) if "ld-linux" in p.name]

    def programs(targets: list[str]) -> list[Path]:
        return [*chosen, *loader] if "aoti" in targets else []

    def toolchain(targets: list[str]) -> dict[str, Any]:
        return {"g++": str(chosen[0]), "include": [], "libdirs": []} if "aoti" in targets else {}

    monkeypatch.setattr(runner_mod.converters, "programs", programs)
    monkeypatch.setattr(runner_mod.converters, "toolchain", toolchain)
    yield chosen


def _leftovers(runner: SandboxRunner, name: str) -> list[int]:
    """Processes called `name` of a job uid, anywhere on the machine."""
    uids = job_uids() if os.geteuid() == 0 else {os.geteuid()}
    found = []
    for proc in scan().values():
        try:
            comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == name and uids & set(proc.uids):
            found.append(proc.pid)
    return found


@pytest.mark.slow
@needs_root
def test_nothing_a_toolchain_program_starts_outlives_it(
    root: Path, fake_compiler: list[Path]
) -> None:
    with fresh_runner(work_root=root / "work-linger", spares=False) as runner:
        fake_compiler.append(_lingerer(runner, "lingerer", 16, 0))
        result = _run(
            runner, "toolchain_lingerer.py", {"targets": ["aoti"], "verify": {"samples": 0}}
        )
        assert result.error is None, result.error  # the stand-in ran, and exited 0
        assert runner.wait_for_cleanup(30)
        assert _leftovers(runner, "lingerer") == []
        # The next job gets the uid back with nothing of the first left under it.
        zygote = runner.zygote_pid
        table = scan()
        for proc in table.values():
            if set(proc.uids) & job_uids():
                assert not _below(proc.pid, zygote, table), proc


@pytest.mark.slow
@needs_root
def test_what_a_toolchain_program_starts_counts_against_the_job(
    root: Path, fake_compiler: list[Path]
) -> None:
    with fresh_runner(work_root=root / "work-memory", spares=False) as runner:
        fake_compiler.append(_lingerer(runner, "lingerer-big", 900, 10))
        started = time.monotonic()
        result = _run(
            runner,
            "toolchain_lingerer.py",
            {"targets": ["aoti"], "verify": {"samples": 0}, "memory_mb": 512},
        )
        assert result.error is not None and result.error.code == "out_of_memory", result.error
        assert time.monotonic() - started < 60
        assert runner.wait_for_cleanup(30)
        assert _leftovers(runner, "lingerer-big") == []


def _below(pid: int, anchor: int | None, table: dict[int, Any]) -> bool:
    while pid in table and table[pid].ppid > 1:
        pid = table[pid].ppid
        if pid == anchor:
            return True
    return False
