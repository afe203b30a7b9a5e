"""Hostile uploads, each run through the real sandbox and judged by effect.

After every hostile job: the listeners saw nothing, no marker file appeared, the
installed code is unchanged, the canary secret is nowhere in what a user gets
back, no process of the job is left, the zygote and the worker are alive, the
next benign job succeeds, and the job took no longer than its timeout allows.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import time
import zipfile
from pathlib import Path

import pytest

from schemas import ExportOptions
from tests.sandbox.conftest import (
    CANARY,
    MARGIN_S,
    SIBLING_CANARY,
    SPARE_WAIT_S,
    Arena,
    digest,
    job_processes,
)
from worker.sandbox import SandboxResult

TIMEOUT_S = 20.0


@pytest.fixture
def arena(each_arena: Arena) -> Arena:
    """Every test here runs twice: in a fresh fork and in a pre-warmed spare."""
    return each_arena


def user_visible(result: SandboxResult, job_dir: Path) -> str:
    """Everything a user can read back: report, error, output tail, served logs."""
    parts = [result.report.model_dump_json(), result.stdout_tail]
    if result.error is not None:
        parts.append(result.error.model_dump_json())
    for path in job_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log"):
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def assert_contained(
    arena: Arena, result: SandboxResult, job_dir: Path, elapsed: float, timeout: float = TIMEOUT_S
) -> None:
    seen = user_visible(result, job_dir)
    assert CANARY not in seen
    assert SIBLING_CANARY not in seen
    assert arena.listeners.received == []
    assert sorted(os.listdir(arena.marker_dir)) == []
    assert {path: digest(path) for path in arena.installed} == arena.installed
    assert elapsed <= timeout + MARGIN_S
    deadline = time.monotonic() + 2
    while job_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job_processes() == []
    assert arena.runner.zygote_pid == arena.zygote_pid
    assert os.path.exists(f"/proc/{arena.zygote_pid}")
    assert result.report.sandbox is not None
    benign, _, _ = arena.run(arena.model("benign"))
    assert benign.report.status == "succeeded"
    assert benign.error is None


def run_hostile(arena: Arena, name: str, **options: object) -> tuple[SandboxResult, Path]:
    timeout = float(options.setdefault("timeout_s", TIMEOUT_S))  # type: ignore[arg-type]
    result, elapsed, job_dir = arena.run(arena.model(name), options=options)
    assert_contained(arena, result, job_dir, elapsed, timeout)
    return result, job_dir


def test_network_connections_are_refused(arena: Arena) -> None:
    result, _ = run_hostile(arena, "network")
    assert result.error is not None
    assert result.error.code == "sandbox_violation"
    message = result.error.message + str(result.error.details)
    assert "tcp:ok" not in message


def test_secrets_stay_out(arena: Arena) -> None:
    result, _ = run_hostile(arena, "secrets")
    assert result.report.status == "failed"


def test_exec_of_a_shell_is_refused(arena: Arena) -> None:
    result, _ = run_hostile(arena, "exec")
    assert result.report.status == "succeeded"
    codes = [w.code for w in result.report.warnings]
    assert "sandbox_denied" in codes


def test_round_trip_pipes_answer_only_refusals(arena: Arena) -> None:
    result, job_dir = run_hostile(arena, "roundtrip")
    assert result.error is not None  # it raised, or the zygote killed it for the long line
    log = (job_dir / "sandbox.log").read_text(errors="replace")
    found = re.search(r"ANSWERS(\[.*?\])ANSWERS", log)
    assert found is not None, (result.error, len(log), log[:3000])
    *statuses, first_reason, last_reason = json.loads(found.group(1))
    assert statuses == ["failed"] * 6
    assert first_reason == "no loader for this payload"
    assert last_reason == "too many round-trip requests"
    assert result.report.sandbox is not None
    assert result.report.sandbox.details["roundtrips"]["loaders"] == 4  # MAX_ROUNDTRIPS


def test_fork_bomb_and_daemon_leave_nothing(arena: Arena) -> None:
    result, _ = run_hostile(arena, "fork")
    time.sleep(2.5)  # the daemon would have written its marker by now
    assert sorted(os.listdir(arena.marker_dir)) == []
    assert job_processes() == []
    assert "sandbox_denied" in [w.code for w in result.report.warnings]


def test_huge_allocation_is_out_of_memory(arena: Arena) -> None:
    result, _ = run_hostile(arena, "memory", memory_mb=1024)
    assert result.error is not None
    assert result.error.code == "out_of_memory"


def test_growing_resident_memory_is_out_of_memory(arena: Arena) -> None:
    result, _ = run_hostile(arena, "memory_touch", memory_mb=512)
    assert result.error is not None
    assert result.error.code == "out_of_memory"


def test_writing_10_gb_stops_at_the_file_size_limit(arena: Arena) -> None:
    result, job_dir = run_hostile(arena, "disk")
    assert result.report.status == "failed"
    total = sum(p.stat().st_size for p in job_dir.rglob("*") if p.is_file())
    assert total < 64 << 20
    # The job's staging directory is deleted in the background once the job ended.
    assert arena.runner.wait_for_cleanup(30)
    assert arena.runner.work_root is not None
    for left in (arena.runner.jobs_root, arena.runner.work_root / "trash"):
        assert sum(p.stat().st_size for p in left.rglob("*") if p.is_file()) < 1 << 20


def test_cpu_spin_times_out(arena: Arena) -> None:
    result, _ = run_hostile(arena, "spin", timeout_s=3)
    assert result.error is not None
    assert result.error.code == "timeout"


def test_sleeping_forever_at_import_times_out(arena: Arena) -> None:
    result, _ = run_hostile(arena, "sleep", timeout_s=3)
    assert result.error is not None
    assert result.error.code == "timeout"


def test_signals_and_ptrace_reach_nobody(arena: Arena) -> None:
    run_hostile(arena, "signals")
    with open(f"/proc/{os.getpid()}/status") as handle:
        state = next(line for line in handle if line.startswith("State:"))
    assert "t" not in state.split()[1].lower()


def test_installed_code_and_sibling_jobs_are_out_of_reach(arena: Arena) -> None:
    result, _ = run_hostile(arena, "filesystem")
    assert result.error is not None
    assert (arena.sibling_dir / "in" / "model.py").read_text() == SIBLING_CANARY
    assert not Path("/tmp/marker-fs").exists()


def test_stdout_flood_is_capped(arena: Arena) -> None:
    result, job_dir = run_hostile(arena, "flood")
    assert (job_dir / "sandbox.log").stat().st_size <= 256 << 10
    assert len(result.stdout_tail) <= 9000


def test_children_of_a_warm_zygote_never_hang(arena: Arena) -> None:
    zygote = arena.runner.zygote_pid
    threads_at_start = len(os.listdir(f"/proc/{zygote}/task"))
    for model in ("threadpool", "threadpool", "benign"):
        result, _ = run_hostile(arena, model, timeout_s=30)
        assert result.report.status == "succeeded"
    # The zygote itself never started a pool (or any thread) while serving jobs.
    assert len(os.listdir(f"/proc/{zygote}/task")) == threads_at_start


def test_outputs_tampered_with_while_read_back_are_kept_whole_or_refused(arena: Arena) -> None:
    # From 20 ms after the job says it is done until it exits (0.5 s later), it swaps
    # its outputs: a link to the secret, a rewritten program, a forged report. The
    # worker read them back into copies when told "done": a success can only be the
    # outputs as they were then; no link is followed; each artifact served is the very
    # file whose size and SHA-256 the report lists.
    for _ in range(3):
        result, job_dir = run_hostile(arena, "outputs")
        assert not (job_dir / ".accepted").exists()
        if result.report.status == "failed":  # a slow worker read after the swap
            assert result.error is not None and result.error.code == "internal_error"
            continue
        listed = {a.name: (a.size, a.sha256) for a in result.report.artifacts}
        assert set(listed) == {"program.pt2", "graph.json", "signature.json"}
        for name, (size, sha) in listed.items():
            path = result.artifacts[name]
            assert not path.is_symlink() and path.is_file()
            assert (path.stat().st_size, digest(path)) == (size, sha)
        assert b"tampered" not in result.artifacts["program.pt2"].read_bytes()
        assert b"tampered" not in result.artifacts["signature.json"].read_bytes()
        assert result.report.model is not None  # the real report, not the forged one


def test_pickle_payload_in_inputs_does_not_run(arena: Arena) -> None:
    import torch

    marker = arena.marker_dir / "pickle"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    buffer = io.BytesIO()
    torch.save({"args": (Payload(),), "kwargs": {}}, buffer)
    inputs = Path(arena.model("benign")).with_name("inputs.pt")
    inputs.write_bytes(buffer.getvalue())
    result, elapsed, job_dir = arena.run(arena.model("benign"), inputs=inputs)
    assert result.error is not None
    assert result.error.code == "invalid_inputs"
    assert not marker.exists()
    assert_contained(arena, result, job_dir, elapsed)
    assert pickle.dumps(1)  # the test process itself still unpickles normally


def test_zip_with_parent_paths_stays_in_its_directory(arena: Arena) -> None:
    archive = arena.root / "slip.zip"
    escape = "../" * 12 + str(arena.marker_dir).lstrip("/") + "/zipslip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("model.py", (Path(arena.model("benign"))).read_text())
        handle.writestr(escape, "owned")
    result, elapsed, job_dir = arena.run(archive, options={"entry": "model.py"})
    assert not (arena.marker_dir / "zipslip").exists()
    assert_contained(arena, result, job_dir, elapsed)


@pytest.mark.parametrize("code", ["canceled"])
def test_cancel_kills_the_job(arena: Arena, code: str) -> None:
    import threading

    if arena.spares:
        assert arena.runner.wait_for_spares(SPARE_WAIT_S)
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    job_dir = arena.root / "cancel-job"
    from worker.sandbox import SandboxJob

    started = time.monotonic()
    result = arena.runner.run(
        SandboxJob(
            model=arena.model("sleep"),
            inputs=None,
            weights=None,
            options=ExportOptions(),
            job_dir=job_dir,
        ),
        cancel=cancel,
    )
    assert result.error is not None
    assert result.error.code == code
    assert_contained(arena, result, job_dir, time.monotonic() - started, timeout=1.0)
