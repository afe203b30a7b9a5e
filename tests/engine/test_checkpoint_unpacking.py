"""Unpacking a checkpoint zip: the checkpoint's size bound, decided from the zip's names
before anything is written, and members streamed to disk, never held whole in memory."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import pytest

import engine.loading
from engine.errors import InvalidRequest
from engine.loading import unpack_zip

MiB = 1024 * 1024


def stored_zip(path: Path, files: dict[str, bytes]) -> Path:
    """A zip whose members are stored, as `save_pretrained` weights usually go (they do
    not compress)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def checkpoint_files(weights: int, *, folder: str = "ckpt/") -> dict[str, bytes]:
    return {
        f"{folder}config.json": b'{"model_type": "bert"}',
        f"{folder}model.safetensors": b"\x01" * weights,
    }


@pytest.fixture
def small_code_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.loading, "MAX_ZIP_BYTES", MiB)


@pytest.mark.usefixtures("small_code_bound")
@pytest.mark.parametrize("folder", ["", "ckpt/"])
def test_a_checkpoint_unpacks_past_the_code_bound(tmp_path: Path, folder: str) -> None:
    archive = stored_zip(tmp_path / "c.zip", checkpoint_files(2 * MiB, folder=folder))
    files = unpack_zip(archive, tmp_path / "out")
    assert files == [f"{folder}config.json", f"{folder}model.safetensors"]
    assert (tmp_path / "out" / folder / "model.safetensors").stat().st_size == 2 * MiB


@pytest.mark.usefixtures("small_code_bound")
def test_code_keeps_the_code_bound(tmp_path: Path) -> None:
    # config.json beside model.py is code (as the engine loads it), and so is a
    # checkpoint-looking zip whose options name an entry.
    files = {**checkpoint_files(2 * MiB, folder=""), "model.py": b"model = None\n"}
    archive = stored_zip(tmp_path / "code.zip", files)
    with pytest.raises(InvalidRequest) as info:
        unpack_zip(archive, tmp_path / "out")
    assert info.value.details["limit"] == "model"
    assert info.value.details["max_bytes"] == MiB

    archive = stored_zip(tmp_path / "entry.zip", checkpoint_files(2 * MiB))
    with pytest.raises(InvalidRequest) as info:
        unpack_zip(archive, tmp_path / "out2", entry="ckpt/net.py")
    assert (info.value.details["reason"], info.value.details["limit"]) == ("too_large", "model")


def test_a_checkpoint_over_its_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine.loading, "MAX_CHECKPOINT_ZIP_BYTES", MiB)
    archive = stored_zip(tmp_path / "c.zip", checkpoint_files(2 * MiB))
    with pytest.raises(InvalidRequest) as info:
        unpack_zip(archive, tmp_path / "out")
    assert info.value.details["reason"] == "too_large"
    assert info.value.details["limit"] == "checkpoint"
    assert info.value.details["max_bytes"] == MiB
    assert not (tmp_path / "out" / "ckpt" / "model.safetensors").exists()


def test_the_default_checkpoint_bound_is_the_contracts() -> None:
    from schemas.limits import CHECKPOINT_ZIP_MAX_UNPACKED_BYTES, ZIP_MAX_UNPACKED_BYTES

    assert engine.loading.MAX_CHECKPOINT_ZIP_BYTES == CHECKPOINT_ZIP_MAX_UNPACKED_BYTES
    assert 4 * 1024 * MiB == CHECKPOINT_ZIP_MAX_UNPACKED_BYTES
    assert CHECKPOINT_ZIP_MAX_UNPACKED_BYTES > ZIP_MAX_UNPACKED_BYTES


def test_members_stream_to_disk(tmp_path: Path) -> None:
    """A stored 48 MiB weights file costs the unpacking a chunk of memory, not its size."""
    archive = stored_zip(tmp_path / "c.zip", checkpoint_files(48 * MiB))
    tracemalloc.start()
    try:
        unpack_zip(archive, tmp_path / "out")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "out" / "ckpt" / "model.safetensors").stat().st_size == 48 * MiB
    assert peak < 4 * MiB
