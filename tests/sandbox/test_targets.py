"""Deployment targets through the sandbox: converted in the job child, verified and
profiled there, the artifacts taken as untrusted files. The job child never executes
anything, whatever its targets: a job asking for `aoti` or `executorch` may ask the zygote's
toolchain broker to run the compiler or flatc (with flags the broker allows, on its own
files), and one asking for none of them may not even do that."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.conftest import fresh_runner, run_upload
from worker.sandbox import SandboxResult, SandboxRunner
from worker.sandbox.confinement import converters

pytest.importorskip("onnxruntime", reason="the `targets` extra is not installed")
pytest.importorskip("executorch", reason="executorch is not installed (docs/targets.md)")
needs_compiler = pytest.mark.skipif(
    not converters.programs(["aoti"]), reason="no C++ compiler on this machine"
)


@pytest.fixture(scope="module")
def runner() -> Iterator[SandboxRunner]:
    root = Path(tempfile.mkdtemp(prefix="torchport-targets-"))
    os.chmod(root, 0o755)
    with fresh_runner(work_root=root / "work", spares=False) as started:
        yield started
    shutil.rmtree(root, ignore_errors=True)


def _run(runner: SandboxRunner, model: str, options: dict[str, object]) -> SandboxResult:
    return run_upload(runner, model, options)


@pytest.mark.slow
@needs_compiler
def test_every_target_converts_and_verifies_in_the_sandbox(runner: SandboxRunner) -> None:
    result = _run(runner, "service_small.py", {"targets": ["executorch", "onnx", "aoti"]})
    assert result.error is None, result.error
    report = result.report
    assert list(report.targets) == ["onnx", "aoti", "executorch"]  # converted in ORDER
    for name, artifact in (
        ("onnx", "model.onnx"),
        ("aoti", "model.aoti.pt2"),
        ("executorch", "model.pte"),
    ):
        target = report.targets[name]
        assert target.status == "succeeded", target.error
        assert target.artifact == artifact
        assert target.verification is not None and target.verification.passed
        assert artifact in result.artifacts  # taken, listed and hashed by the worker
        assert result.artifacts[artifact].stat().st_size == target.size
    listed = {a.name: a for a in report.artifacts}
    assert {"model.onnx", "model.aoti.pt2", "model.pte"} <= set(listed)
    assert {"landlock", "seccomp"} <= set(report.sandbox.layers if report.sandbox else [])
    # Profiled in the job child too, each in its own runtime, at 1 thread and at the job's.
    assert report.profile is not None
    assert [(a.name, a.status) for a in report.profile.artifacts] == [
        (name, "measured") for name in ("eager", "program", "onnx", "aoti", "executorch")
    ]
    assert not [w for w in report.warnings if w.code == "sandbox_denied"]


def test_onnx_alone_needs_no_exec(runner: SandboxRunner) -> None:
    assert converters.programs(["onnx"]) == []
    result = _run(runner, "service_small.py", {"targets": ["onnx"]})
    assert result.error is None, result.error
    assert result.report.targets["onnx"].status == "succeeded"
    assert "model.onnx" in result.artifacts
    # The profiles (on by default with targets) load and time it in the job child, with
    # ONNX Runtime's own threads, and read the CPU and the job's memory from /proc.
    profile = result.report.profile
    assert profile is not None and profile.machine.cpu is not None
    assert [(a.name, a.status) for a in profile.artifacts] == [
        ("eager", "measured"),
        ("program", "measured"),
        ("onnx", "measured"),
    ]
    assert all(a.peak_rss_mb for a in profile.artifacts)
    assert [s.name for s in result.report.stages][-2:] == ["converting", "profiling"]


def test_onnx_external_data_is_written_in_the_sandbox(runner: SandboxRunner) -> None:
    # onnx_ir writes the weights into a folder beside model.onnx and renames them into
    # place: a rename across directories, which Landlock allows only with FS_REFER.
    result = _run(runner, "profile_mlp.py", {"targets": ["onnx"], "onnx": {"external_data": True}})
    assert result.error is None, result.error
    target = result.report.targets["onnx"]
    assert target.status == "succeeded", target.error
    assert target.verification is not None and target.verification.passed
    assert target.artifacts == ["model.onnx", "model.onnx.data"]
    assert result.artifacts["model.onnx.data"].stat().st_size > 0


@needs_compiler
def test_a_converting_job_runs_only_the_brokered_toolchain(runner: SandboxRunner) -> None:
    result = _run(runner, "hostile_converter.py", {"targets": ["onnx"], "verify": {"samples": 0}})
    # Without aoti/executorch the broker runs nothing: even the control fails, and the
    # upload's own attempts are the job's outcome.
    assert result.error is not None
    assert result.error.code == "sandbox_violation"
    assert "control_compiler_runs': 'PermissionError'" in result.error.details["original_message"]
    # With aoti the import's checks all hold (g++ ran through the broker; exec, fork, the
    # dynamic loader, namespaces and every flag that loads or runs another program were
    # refused), and the target still converts through the broker.
    result = _run(runner, "hostile_converter.py", {"targets": ["aoti"], "verify": {"samples": 0}})
    assert result.error is None, result.error
    assert result.report.targets["aoti"].status == "succeeded"
    denied = [w for w in result.report.warnings if w.code == "sandbox_denied"]
    assert denied
    assert {"subprocess.Popen", "os.fork", "os.posix_spawn"} <= set(denied[0].details["attempted"])


def test_a_failed_target_is_a_warning_unless_required(runner: SandboxRunner) -> None:
    # ExecuTorch refuses a dynamic dim without an upper bound before lowering.
    options: dict[str, object] = {
        "targets": ["executorch"],
        "dynamic_shapes": {"x": {"0": {"name": "batch", "min": 1}}},
    }
    result = _run(runner, "service_small.py", options)
    assert result.error is None, result.error
    target = result.report.targets["executorch"]
    assert target.status == "failed"
    assert target.error is not None and target.error.code == "target_failed"
    assert "model.pte" not in result.artifacts
    assert [w.code for w in result.report.warnings].count("target_failed") == 1
    required = _run(runner, "service_small.py", {**options, "targets_required": True})
    assert required.error is not None
    assert required.error.code == "target_failed"
    assert required.error.details["target"] == "executorch"
    assert "program.pt2" not in required.artifacts
