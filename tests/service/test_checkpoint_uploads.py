"""A checkpoint zip (a `save_pretrained` directory, no `.py`) at the API: its structure is
checked and the `task` option validated, without importing torch (issue 20)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from service.errors import InvalidRequest
from service.jobs import parse_job, validate_uploads
from service.uploads import UploadedFile, UploadedForm


def _form(tmp_path: Path, members: dict[str, bytes], options: str | None = None) -> UploadedForm:
    path = tmp_path / "ckpt.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    upload = UploadedFile("model", "ckpt.zip", path, "0" * 64, path.stat().st_size)
    return UploadedForm(files={"model": upload}, options=options)


@pytest.mark.parametrize("prefix", ["", "my-bert/"])
def test_a_checkpoint_zip_is_accepted(tmp_path: Path, prefix: str) -> None:
    form = _form(
        tmp_path,
        {f"{prefix}config.json": b"{}", f"{prefix}model.safetensors": b"x"},
        '{"task": "fill-mask"}',
    )
    spec = parse_job(form)
    assert spec.options.task == "fill-mask"
    validate_uploads(form, spec.options)


def test_a_zip_with_neither_source_nor_config_is_refused(tmp_path: Path) -> None:
    form = _form(tmp_path, {"deep/er/config.json": b"{}", "model.safetensors": b"x"})
    with pytest.raises(InvalidRequest) as caught:
        validate_uploads(form, parse_job(form).options)
    assert caught.value.code == "invalid_request"
    assert caught.value.details["reason"] == "no_model"


def test_an_unknown_task_is_invalid_request(tmp_path: Path) -> None:
    form = _form(tmp_path, {"config.json": b"{}"}, '{"task": "text-to-everything"}')
    with pytest.raises(InvalidRequest) as caught:
        parse_job(form)
    assert caught.value.code == "invalid_request"
    assert [e["field"] for e in caught.value.details["errors"]] == ["options.task"]
