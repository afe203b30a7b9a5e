"""The worker's side of a job's outputs (runner._take_outputs, after the exit and
while the child exits): untrusted files in, validated copies or
`_Untrusted` out, never another exception."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from schemas import ExportOptions
from schemas.model_zip import TOKENIZER_MAX_BYTES
from tests.sandbox.conftest import MODELS, Arena, digest, fresh_runner, run_benign
from worker.sandbox import SandboxRunner, SandboxSettings
from worker.sandbox.host.outputs import Untrusted as _Untrusted
from worker.sandbox.host.outputs import take_regular


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a job child leaves in its out dir (no artifact digests: the worker's job)."""
    root = tmp_path_factory.mktemp("produced")
    result = run_export(
        ExportRequest(
            upload=Upload(model=MODELS / "hostile_benign.py"),
            options=ExportOptions(),
            out_dir=root / "out",
            work_dir=root / "work",
            digest_artifacts=False,
        )
    )
    assert result.succeeded and result.report.artifacts == []
    return root / "out"


@pytest.fixture
def outputs(produced: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(produced, tmp_path / "out"))


def runner(**settings: int) -> SandboxRunner:
    return SandboxRunner(SandboxSettings(**settings))  # not started: no zygote needed


def test_accepted_outputs_are_copies_hashed_as_copied(outputs: Path, tmp_path: Path) -> None:
    accepted = runner()._take_outputs(outputs, tmp_path / "accepted")
    assert accepted is not None and accepted.report.status == "succeeded"
    assert set(accepted.files) == {"program.pt2", "graph.json", "signature.json"}
    for name, path in accepted.files.items():
        assert path.parent == tmp_path / "accepted"
        info = accepted.infos[name]
        assert (info.size, info.sha256) == (path.stat().st_size, digest(path))
        assert digest(path) == digest(outputs / name)
    # What the job does to its files afterwards does not reach the copies.
    (outputs / "program.pt2").write_bytes(b"PK\x03\x04 rewritten")
    assert digest(accepted.files["program.pt2"]) == accepted.infos["program.pt2"].sha256


def test_a_program_over_the_early_copy_size_waits_for_the_exit(
    outputs: Path, tmp_path: Path
) -> None:
    small = runner(early_copy_bytes=1024)
    assert small._take_outputs(outputs, tmp_path / "accepted") is None
    assert not (tmp_path / "accepted").exists()


def _replace_with_link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@pytest.mark.parametrize(
    "forge",
    [
        lambda out: (out / "report.json").write_text('{"status": "succeeded"}'),
        lambda out: (out / "graph.json").write_text('{"nodes": "none"}'),
        lambda out: _replace_with_link(out / "graph.json", Path("/etc/hostname")),
        lambda out: (out / "program.pt2").write_bytes(b"not a zip"),
        lambda out: (out / "signature.json").unlink(),
    ],
    ids=["forged report", "bad graph", "graph as a link", "program not a zip", "missing file"],
)
def test_bad_outputs_are_untrusted_before_and_after_the_exit(
    outputs: Path, tmp_path: Path, forge: Callable[[Path], object]
) -> None:
    forge(outputs)
    with pytest.raises(_Untrusted):
        runner()._take_outputs(outputs, tmp_path / "accepted")
    with pytest.raises(_Untrusted):
        runner()._take_outputs(outputs)


def test_staging_is_deleted_after_the_job_and_a_crashed_workers_trash_at_start(
    arena: Arena, tmp_path: Path
) -> None:
    result, _, _ = arena.run(arena.model("benign"))
    assert result.report.status == "succeeded", result.error
    assert arena.runner.wait_for_cleanup(30)
    assert arena.runner.work_root is not None
    staged = f"{os.getpid()}-"  # this process's jobs (the arena keeps an "other-job")
    assert [p.name for p in arena.runner.jobs_root.iterdir() if p.name.startswith(staged)] == []
    assert list((arena.runner.work_root / "trash").iterdir()) == []
    # A worker that died mid-cleanup left a staging directory in the trash.
    left = tmp_path / "work" / "trash" / "1234-0-deadbeef"
    (left / "out").mkdir(parents=True)
    (left / "out" / "program.pt2").write_bytes(b"PK\x03\x04")
    with fresh_runner(work_root=tmp_path / "work", spares=False):
        assert not left.exists()


def _with_onnx(out: Path, listed: list[str]) -> None:
    """The report says target onnx succeeded and wrote `listed`; model.onnx is there."""
    from schemas import ReportDocument, TargetResult

    report = ReportDocument.model_validate_json((out / "report.json").read_text())
    report.targets["onnx"] = TargetResult(
        status="succeeded", artifact="model.onnx", artifacts=listed
    )
    (out / "report.json").write_text(report.model_dump_json())
    (out / "model.onnx").write_bytes(b"\x08\x0a onnx")


def test_onnx_external_data_is_taken_when_listed(outputs: Path, tmp_path: Path) -> None:
    _with_onnx(outputs, ["model.onnx", "model.onnx.data"])
    (outputs / "model.onnx.data").write_bytes(b"\x00" * 4096)
    accepted = runner()._take_outputs(outputs, tmp_path / "accepted")
    assert accepted is not None
    assert {"model.onnx", "model.onnx.data"} <= set(accepted.files)
    assert accepted.infos["model.onnx.data"].size == 4096
    after = runner()._take_outputs(outputs)
    assert after is not None and after.files["model.onnx.data"] == outputs / "model.onnx.data"


def test_files_beside_an_artifact_are_taken_only_when_listed_and_known(
    outputs: Path, tmp_path: Path
) -> None:
    _with_onnx(outputs, ["model.onnx", "extra.bin", "../escape"])
    (outputs / "model.onnx.data").write_bytes(b"unlisted")
    (outputs / "extra.bin").write_bytes(b"not a target's file")
    accepted = runner()._take_outputs(outputs, tmp_path / "accepted")
    assert accepted is not None
    assert {"model.onnx.data", "extra.bin", "../escape"}.isdisjoint(accepted.files)
    assert "model.onnx" in accepted.files


@pytest.mark.parametrize(
    "forge",
    [
        lambda out: (out / "model.onnx.data").symlink_to(Path("/etc/hostname")),
        lambda out: (out / "model.onnx.data").write_bytes(b"\x00" * (1 << 20)),
        lambda out: None,  # listed, not written
    ],
    ids=["data as a link", "data over the size limit", "data missing"],
)
def test_bad_external_data_is_untrusted(
    outputs: Path, tmp_path: Path, forge: Callable[[Path], object]
) -> None:
    _with_onnx(outputs, ["model.onnx", "model.onnx.data"])
    forge(outputs)
    limit = (outputs / "program.pt2").stat().st_size + 1024
    with pytest.raises(_Untrusted):
        runner(max_program_bytes=limit)._take_outputs(outputs, tmp_path / "accepted")
    with pytest.raises(_Untrusted):
        runner(max_program_bytes=limit)._take_outputs(outputs)


def _with_tokenizer(out: Path, listed: list[str]) -> None:
    """The report says the checkpoint's tokenizer files `listed` were written."""
    from schemas import ReportDocument
    from schemas.upload_report import CheckpointReport

    report = ReportDocument.model_validate_json((out / "report.json").read_text())
    report.checkpoint = CheckpointReport(
        task="text-generation",
        task_source="options",
        model_type="llama",
        model_class="LlamaForCausalLM",
        weights_format="safetensors",
        tokenizer_files=listed,
    )
    (out / "report.json").write_text(report.model_dump_json())


def test_tokenizer_files_are_taken_when_listed_and_known(outputs: Path, tmp_path: Path) -> None:
    _with_tokenizer(outputs, ["tokenizer.json", "report.json", "notes.txt", "../escape"])
    (outputs / "tokenizer.json").write_bytes(b'{"model": {}}')
    (outputs / "notes.txt").write_bytes(b"listed, but no tokenizer file")
    (outputs / "merges.txt").write_bytes(b"a tokenizer file, but not listed")
    accepted = runner()._take_outputs(outputs, tmp_path / "accepted")
    assert accepted is not None
    assert accepted.infos["tokenizer.json"].size == len(b'{"model": {}}')
    assert {"notes.txt", "merges.txt", "../escape"}.isdisjoint(accepted.files)
    after = runner()._take_outputs(outputs)
    assert after is not None and after.files["tokenizer.json"] == outputs / "tokenizer.json"


@pytest.mark.parametrize(
    "forge",
    [
        lambda out: (out / "tokenizer.json").symlink_to(Path("/etc/hostname")),
        lambda out: (out / "tokenizer.json").write_bytes(b"\x00" * (TOKENIZER_MAX_BYTES + 1)),
        lambda out: None,  # listed, not written
    ],
    ids=["a link", "over the tokenizer limit", "missing"],
)
def test_a_bad_tokenizer_file_is_untrusted(
    outputs: Path, tmp_path: Path, forge: Callable[[Path], object]
) -> None:
    _with_tokenizer(outputs, ["tokenizer.json"])
    forge(outputs)
    with pytest.raises(_Untrusted):
        runner()._take_outputs(outputs, tmp_path / "accepted")
    with pytest.raises(_Untrusted):
        runner()._take_outputs(outputs)


def _with_encoder(out: Path) -> None:
    """The report says the model is an encoder-decoder one: its encoder.pt2 is expected."""
    from schemas import EncoderReport, GenerationReport, ReportDocument

    report = ReportDocument.model_validate_json((out / "report.json").read_text())
    report.generation = GenerationReport(max_cache_len=32, encoder=EncoderReport())
    (out / "report.json").write_text(report.model_dump_json())


def test_an_encoder_program_is_taken_when_the_report_has_an_encoder(
    outputs: Path, tmp_path: Path
) -> None:
    shutil.copy(outputs / "program.pt2", outputs / "encoder.pt2")
    plain = runner()._take_outputs(outputs, tmp_path / "plain")
    assert plain is not None and "encoder.pt2" not in plain.files  # no encoder in the report
    _with_encoder(outputs)
    accepted = runner()._take_outputs(outputs, tmp_path / "accepted")
    assert accepted is not None and "encoder.pt2" in accepted.files
    assert accepted.infos["encoder.pt2"].sha256 == digest(outputs / "encoder.pt2")


@pytest.mark.parametrize(
    "forge",
    [
        lambda out: (out / "encoder.pt2").symlink_to(out / "program.pt2"),
        lambda out: (out / "encoder.pt2").write_bytes(b"not a zip archive"),
        lambda out: None,  # in the report, not written
    ],
    ids=["a link", "not a zip", "missing"],
)
def test_a_bad_encoder_program_is_untrusted(
    outputs: Path, tmp_path: Path, forge: Callable[[Path], object]
) -> None:
    _with_encoder(outputs)
    forge(outputs)
    with pytest.raises(_Untrusted):
        runner()._take_outputs(outputs, tmp_path / "accepted")
    with pytest.raises(_Untrusted):
        runner()._take_outputs(outputs)


def test_after_the_exit_a_file_is_moved_out_and_hashed_where_it_lands(
    outputs: Path, tmp_path: Path
) -> None:
    program = outputs / "program.pt2"
    expected = digest(program)
    os.chmod(program, 0o600)
    target = tmp_path / "kept.pt2"
    info = take_regular(program, target, 1 << 30)
    assert info is not None and not program.exists()
    assert (info.size, info.sha256) == (target.stat().st_size, expected)
    assert digest(target) == expected
    mode = target.stat()
    assert (mode.st_uid, mode.st_mode & 0o777) == (os.getuid(), 0o644)
    assert take_regular(outputs / "absent.pt2", tmp_path / "absent", 1 << 30) is None


@pytest.mark.parametrize("kind", ["link", "fifo", "too large", "empty"])
def test_what_is_not_a_regular_file_within_the_limit_is_refused_and_not_kept(
    outputs: Path, tmp_path: Path, kind: str
) -> None:
    program = outputs / "program.pt2"
    limit = 1 << 30
    if kind == "link":
        _replace_with_link(program, Path("/etc/hostname"))
    elif kind == "fifo":
        program.unlink()
        os.mkfifo(program)
    elif kind == "empty":
        program.write_bytes(b"")
    else:
        limit = program.stat().st_size - 1
    before = digest(Path("/etc/hostname"))
    with pytest.raises(_Untrusted):
        take_regular(program, tmp_path / "kept.pt2", limit)
    assert not (tmp_path / "kept.pt2").exists() and not (tmp_path / "kept.pt2").is_symlink()
    assert digest(Path("/etc/hostname")) == before


def test_on_another_file_system_the_file_is_copied(outputs: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(outputs).st_dev:
        pytest.fail("this test needs /dev/shm on a file system of its own")
    program = outputs / "program.pt2"
    expected = digest(program)
    target = shm / f"torchport-kept-{os.getpid()}.pt2"
    try:
        info = take_regular(program, target, 1 << 30)
        assert info is not None and info.sha256 == expected == digest(target)
        assert program.exists()  # copied: the job's file stays, removed with its staging
    finally:
        target.unlink(missing_ok=True)


def test_a_program_taken_after_the_exit_is_the_one_the_report_lists(arena: Arena) -> None:
    with fresh_runner(early_copy_bytes=1024, spares=False) as runner:
        result = run_benign(runner, arena, "late")
    job_dir = arena.root / f"late-{os.getpid()}"
    assert result.report.status == "succeeded", result.error
    listed = {a.name: (a.size, a.sha256) for a in result.report.artifacts}
    for name in ("program.pt2", "graph.json", "signature.json"):
        path = result.artifacts[name]
        assert path.parent == job_dir / "out"
        assert listed[name] == (path.stat().st_size, digest(path))
        assert path.stat().st_uid == os.getuid()
