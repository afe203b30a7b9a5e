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
        assert zf.namelist() == ["config.json", "generation_config.json", "model.safetensors"]
    assert archive.name == "ckpt.zip" and len(said) == 1
    (directory / "model.safetensors").unlink()  # .bin only when there is no safetensors
    assert [p.name for p in checkpoint_files(directory)] == [
        "config.json",
        "generation_config.json",
        "pytorch_model.bin",
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
