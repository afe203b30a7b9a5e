"""`torchport export DIR` / `torchport submit DIR`: a `save_pretrained` directory is zipped
with only what the engine reads (issue 20)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.engine.test_checkpoints import bert
from torchport.checkpoints import checkpoint_files, upload_path
from torchport.cli import main


def test_only_config_and_weights_are_zipped(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "vocab.txt",
        "README.md",
        "optimizer.pt",
        "pytorch_model.bin",
        "modeling_x.py",
    ):
        (directory / name).write_text("{}")
    said: list[str] = []
    archive = upload_path(directory, tmp_path, said.append)
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist() == [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "vocab.txt",
        ]
    assert archive.name == "ckpt.zip" and len(said) == 1
    (directory / "model.safetensors").unlink()  # .bin only when there is no safetensors
    assert [p.name for p in checkpoint_files(directory)] == [
        "config.json",
        "generation_config.json",
        "pytorch_model.bin",
        "tokenizer.json",
        "vocab.txt",
    ]
    (directory / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "modeling_x.X"}}))
    assert "modeling_x.py" in [p.name for p in checkpoint_files(directory)]
    assert (
        upload_path(directory / "config.json", tmp_path, said.append) == directory / "config.json"
    )


def test_export_of_a_directory_with_a_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = bert(tmp_path)
    (directory / "tokenizer.json").write_text("{}")
    options = json.dumps({"verify": {"enabled": False}, "decomposition": {"mode": "none"}})
    code = main(
        [
            "export",
            str(directory),
            "--task",
            "feature-extraction",
            "--options",
            options,
            "--out",
            str(tmp_path / "out"),
            "--json",
            "--no-sandbox",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["error"]
    assert report["checkpoint"]["task"] == "feature-extraction"
    assert report["checkpoint"]["task_source"] == "options"
    assert report["checkpoint"]["model_class"] == "BertModel"


def test_an_unknown_task_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["export", str(bert(tmp_path)), "--task", "nope", "--json", "--no-sandbox"])
    assert code == 2
    error = json.loads(capsys.readouterr().out)
    assert error["code"] == "invalid_request"
    assert [e["field"] for e in error["details"]["errors"]] == ["task"]


def _adapter(directory: Path, base: str | None = None) -> Path:
    directory.mkdir(parents=True)
    config = {"peft_type": "LORA", "base_model_name_or_path": base}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    for name in ("adapter_model.safetensors", "README.md", "tokenizer.json"):
        (directory / name).write_text("{}")
    return directory


def _members(archive: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        return zf.namelist()


def test_adapter_folders_are_zipped_with_the_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        (directory / name).write_text("{}")
    _adapter(directory / "lora")
    (directory / "runs").mkdir()  # a folder without an adapter stays behind
    (directory / "runs" / "events.out").write_text("x")
    said: list[str] = []
    archive = upload_path(directory, tmp_path, said.append)
    assert _members(archive) == [
        "config.json",
        "model.safetensors",
        "lora/adapter_config.json",
        "lora/adapter_model.safetensors",
    ]
    assert len(said) == 1 and "lora/adapter_model.safetensors" in said[0]

    elsewhere = _adapter(tmp_path / "elsewhere" / "my-lora")  # --adapter: only that one
    archive = upload_path(directory, tmp_path / "elsewhere", said.append, elsewhere)
    assert _members(archive)[2:] == [
        "my-lora/adapter_config.json",
        "my-lora/adapter_model.safetensors",
    ]


def test_an_adapter_directory_goes_with_its_local_base(tmp_path: Path) -> None:
    base = bert(tmp_path)
    with_base = _adapter(tmp_path / "with-base", str(base))
    assert _members(upload_path(with_base, tmp_path, [].append)) == [
        "config.json",
        "model.safetensors",
        "with-base/adapter_config.json",
        "with-base/adapter_model.safetensors",
    ]
    alone = _adapter(tmp_path / "alone", "meta-llama/Llama-3.2-1B")  # the engine refuses it
    assert _members(upload_path(alone, tmp_path, [].append)) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def test_an_adapter_that_is_no_adapter_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["export", str(bert(tmp_path)), "--adapter", str(tmp_path), "--json", "--no-sandbox"]
    )
    assert code == 2
    error = json.loads(capsys.readouterr().out)
    assert (error["code"], error["details"]["argument"]) == ("invalid_request", "--adapter")


def test_a_directory_exported_in_the_sandbox_is_zipped_once_and_moved_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    copied: list[str] = []
    real = shutil.copyfile

    def spy(source: object, target: object, **kwargs: object) -> object:
        copied.append(str(source))
        return real(source, target, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "copyfile", spy)
    directory = bert(tmp_path)
    options = json.dumps({"verify": {"enabled": False}, "decomposition": {"mode": "none"}})
    out = tmp_path / "out"
    task = ["--task", "feature-extraction", "--options", options]
    code = main(["export", str(directory), *task, "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["error"]
    assert report["sandbox"]["layers"][0] == "zygote"
    assert report["checkpoint"]["model_class"] == "BertModel"
    assert {"program.pt2", "graph.json", "signature.json", "report.json"} <= {
        p.name for p in out.iterdir()
    }
    # the zip went into the job's staging by a rename, the artifacts into --out likewise
    assert [c for c in copied if c.endswith(".zip") or Path(c).parent.name == "out"] == []


def test_a_spent_file_is_moved_or_copied_then_gone(tmp_path: Path) -> None:
    from worker.sandbox import SpentFile

    source = tmp_path / "c.zip"
    source.write_bytes(b"PK\x03\x04 one")
    SpentFile(source).copy_to(tmp_path / "staged.zip")
    assert not source.exists() and (tmp_path / "staged.zip").read_bytes() == b"PK\x03\x04 one"
    shm = Path("/dev/shm")
    assert shm.is_dir() and shm.stat().st_dev != tmp_path.stat().st_dev
    source.write_bytes(b"PK\x03\x04 two")
    target = shm / f"torchport-spent-{tmp_path.name}.zip"
    try:
        SpentFile(source).copy_to(target)  # another file system: copied, then removed
        assert not source.exists() and target.read_bytes() == b"PK\x03\x04 two"
    finally:
        target.unlink(missing_ok=True)


def test_a_directory_is_zipped_while_the_sandbox_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox's start (seconds: its zygote imports torch) and the checkpoint's zip
    overlap: the zip is made while the start is under way, and the start's outcome (here a
    refusal) still reaches the report."""
    import threading

    import torchport.commands.export as export_command
    from worker.sandbox import SandboxRunner, SandboxUnavailable

    starting, zipped = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def start(runner: SandboxRunner) -> SandboxRunner:
        starting.set()
        seen["zipped during the start"] = zipped.wait(timeout=30)
        raise SandboxUnavailable("refused by the test")

    def zipping(*args: object, **kwargs: object) -> Path:
        seen["start under way"] = starting.wait(timeout=30)
        try:
            return upload_path(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            zipped.set()

    monkeypatch.setattr(SandboxRunner, "start", start)
    monkeypatch.setattr(export_command, "upload_path", zipping)
    out = tmp_path / "out"
    code = main(["export", str(bert(tmp_path)), "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert seen == {"start under way": True, "zipped during the start": True}
    assert code == 1
    assert report["error"]["code"] == "sandbox_violation"
    assert report["error"]["details"]["reason"] == "refused by the test"
