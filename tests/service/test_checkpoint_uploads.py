"""A checkpoint zip (a `save_pretrained` directory, no `.py`) at the API: its structure is
checked and the `task` option validated, without importing torch (issue 20); it gets the
checkpoint's size limits, any other model the model's (limits lowered by settings here)."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import service.upload_checks
from service.errors import InvalidRequest, UploadTooLarge
from service.jobs import parse_job
from service.upload_checks import validate_uploads
from service.uploads import UploadedFile, UploadedForm
from tests.service.conftest import embedded_client

KiB = 1024
MODEL_LIMIT = 64 * KiB
CHECKPOINT_LIMIT = 1024 * KiB


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
    validate_uploads(form, spec.options, max_model_bytes=MODEL_LIMIT)


def test_a_zip_with_neither_source_nor_config_is_refused(tmp_path: Path) -> None:
    form = _form(tmp_path, {"deep/er/config.json": b"{}", "model.safetensors": b"x"})
    with pytest.raises(InvalidRequest) as caught:
        validate_uploads(form, parse_job(form).options, max_model_bytes=MODEL_LIMIT)
    assert caught.value.code == "invalid_request"
    assert caught.value.details["reason"] == "no_model"


def test_an_unknown_task_is_invalid_request(tmp_path: Path) -> None:
    form = _form(tmp_path, {"config.json": b"{}"}, '{"task": "text-to-everything"}')
    with pytest.raises(InvalidRequest) as caught:
        parse_job(form)
    assert caught.value.code == "invalid_request"
    assert [e["field"] for e in caught.value.details["errors"]] == ["options.task"]


WEIGHTS = bytes(range(256)) * (512 * KiB // 256)
"""Half a MiB that does not compress: over the model limit, under the checkpoint's."""


def _checkpoint(
    prefix: str = "my-bert/", extra: dict[str, bytes] | None = None
) -> dict[str, bytes]:
    return {f"{prefix}config.json": b"{}", f"{prefix}model.safetensors": WEIGHTS, **(extra or {})}


def test_a_checkpoint_over_the_model_limit_is_checked_against_its_own(tmp_path: Path) -> None:
    form = _form(tmp_path, _checkpoint())
    assert form.files["model"].size > MODEL_LIMIT
    validate_uploads(form, parse_job(form).options, max_model_bytes=MODEL_LIMIT)


@pytest.mark.parametrize(
    ("members", "options"),
    [
        (_checkpoint("", {"model.py": b"model = None\n"}), None),  # code beside a config
        (_checkpoint("", {"net.py": b"model = None\n"}), '{"entry": "net.py"}'),
        ({"pkg/net.py": b"model = None\n", "pkg/blob.bin": WEIGHTS}, None),
    ],
)
def test_a_zip_of_code_keeps_the_model_limit(
    tmp_path: Path, members: dict[str, bytes], options: str | None
) -> None:
    form = _form(tmp_path, members, options)
    with pytest.raises(UploadTooLarge) as caught:
        validate_uploads(form, parse_job(form).options, max_model_bytes=MODEL_LIMIT)
    assert caught.value.code == "upload_too_large"
    assert caught.value.details == {
        "field": "model",
        "limit_bytes": MODEL_LIMIT,
        "limit": "model",
    }


@pytest.mark.parametrize(
    ("members", "limit", "bound"),
    [
        (_checkpoint(), "checkpoint", "CHECKPOINT_ZIP_MAX_UNPACKED_BYTES"),
        ({"net.py": b"model = None\n", "blob.bin": WEIGHTS}, "model", "ZIP_MAX_UNPACKED_BYTES"),
    ],
)
def test_the_unpacked_bound_is_the_checkpoints_or_the_codes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    members: dict[str, bytes],
    limit: str,
    bound: str,
) -> None:
    monkeypatch.setattr(service.upload_checks, bound, 256 * KiB)
    form = _form(tmp_path, members)
    with pytest.raises(InvalidRequest) as caught:
        validate_uploads(form, parse_job(form).options, max_model_bytes=CHECKPOINT_LIMIT)
    details = caught.value.details
    assert (details["reason"], details["limit"]) == ("zip_too_large", limit)
    assert details["max_unpacked_bytes"] == 256 * KiB


@pytest.fixture
def small_limits(tmp_path: Path) -> Iterator[TestClient]:
    """The embedded API with the model and checkpoint limits lowered (a fast stand-in for
    16 MiB and 4 GiB)."""
    yield from embedded_client(
        tmp_path / "embedded", max_model_bytes=MODEL_LIMIT, max_checkpoint_bytes=CHECKPOINT_LIMIT
    )


def _zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_the_api_takes_a_checkpoint_past_the_model_limit(small_limits: TestClient) -> None:
    answer = small_limits.post(
        "/v1/exports",
        files={"model": ("my-bert.zip", _zipped(_checkpoint()), "application/zip")},
        data={"options": json.dumps({"task": "fill-mask"})},
    )
    assert answer.status_code == 202, answer.json()
    job = answer.json()
    assert (job["status"], job["options"]["task"], job["model_name"]) == (
        "queued",
        "fill-mask",
        "my-bert.zip",
    )


@pytest.mark.parametrize(
    ("name", "data", "limit", "limit_bytes"),
    [
        ("net.py", b"#" * (MODEL_LIMIT + 1), "model", MODEL_LIMIT),  # refused as it streams
        (
            "code.zip",
            _zipped({"net.py": b"model = None\n", "blob.bin": WEIGHTS}),
            "model",
            MODEL_LIMIT,
        ),
        (
            "big.zip",
            _zipped(_checkpoint(extra={"my-bert/more.safetensors": WEIGHTS * 2})),
            "checkpoint",
            CHECKPOINT_LIMIT,
        ),
    ],
)
def test_the_api_says_which_limit_applied(
    small_limits: TestClient, name: str, data: bytes, limit: str, limit_bytes: int
) -> None:
    answer = small_limits.post("/v1/exports", files={"model": (name, data)})
    assert answer.status_code == 413
    body = answer.json()
    assert body["code"] == "upload_too_large"
    assert body["details"] == {"field": "model", "limit_bytes": limit_bytes, "limit": limit}
    assert small_limits.get("/v1/exports").json()["items"] == []


@pytest.mark.parametrize("prefix", ["", "my-lora/"])
def test_an_adapter_without_its_base_is_refused(tmp_path: Path, prefix: str) -> None:
    adapter = {f"{prefix}adapter_config.json": b"{}", f"{prefix}adapter_model.safetensors": b"x"}
    form = _form(tmp_path, adapter)
    with pytest.raises(InvalidRequest) as caught:
        validate_uploads(form, parse_job(form).options, max_model_bytes=MODEL_LIMIT)
    assert (caught.value.code, caught.value.details["reason"]) == (
        "invalid_request",
        "adapter_without_base",
    )


def test_a_checkpoint_with_an_adapter_folder_is_a_checkpoint(tmp_path: Path) -> None:
    members = _checkpoint(extra={"my-bert/lora/adapter_config.json": b"{}"})
    form = _form(tmp_path, {**members, "my-bert/lora/adapter_model.safetensors": WEIGHTS})
    assert form.files["model"].size > MODEL_LIMIT
    options = parse_job(form).options
    validate_uploads(form, options, max_model_bytes=MODEL_LIMIT)
