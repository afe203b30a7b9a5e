"""Unpacking a checkpoint zip: the checkpoint's size bound, decided from the zip's names
before anything is written, and members streamed to disk, never held whole in memory."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import pytest

import engine.load.loading
from engine.errors import InvalidRequest
from engine.load.checkpoint import in_archive
from engine.load.loading import unpack_zip

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
    monkeypatch.setattr(engine.load.loading, "MAX_ZIP_BYTES", MiB)


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
    monkeypatch.setattr(engine.load.loading, "MAX_CHECKPOINT_ZIP_BYTES", MiB)
    archive = stored_zip(tmp_path / "c.zip", checkpoint_files(2 * MiB))
    with pytest.raises(InvalidRequest) as info:
        unpack_zip(archive, tmp_path / "out")
    assert info.value.details["reason"] == "too_large"
    assert info.value.details["limit"] == "checkpoint"
    assert info.value.details["max_bytes"] == MiB
    assert not (tmp_path / "out" / "ckpt" / "model.safetensors").exists()


def test_the_default_checkpoint_bound_is_the_contracts() -> None:
    from schemas.limits import CHECKPOINT_ZIP_MAX_UNPACKED_BYTES, ZIP_MAX_UNPACKED_BYTES

    assert engine.load.loading.MAX_CHECKPOINT_ZIP_BYTES == CHECKPOINT_ZIP_MAX_UNPACKED_BYTES
    assert 20 * 1024 * MiB == CHECKPOINT_ZIP_MAX_UNPACKED_BYTES
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


def test_large_stored_members_are_copied_by_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = bytes(range(256)) * (8 * 1024 * 3)  # 6 MiB, not one repeated byte
    archive = stored_zip(
        tmp_path / "c.zip", {"ckpt/config.json": b"{}", "ckpt/model.safetensors": weights}
    )
    calls: list[int] = []
    real = in_archive.os.copy_file_range

    def counted(*args: object) -> int:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(in_archive.os, "copy_file_range", counted)
    assert unpack_zip(archive, tmp_path / "out") == ["ckpt/config.json", "ckpt/model.safetensors"]
    assert (tmp_path / "out" / "ckpt" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "out" / "ckpt" / "config.json").read_bytes() == b"{}"  # small: zipfile
    assert calls  # the weights went through the kernel


def test_a_refused_kernel_copy_falls_back_to_zipfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = b"\x07" * (2 * MiB)
    archive = stored_zip(
        tmp_path / "c.zip", {"ckpt/config.json": b"{}", "ckpt/w.safetensors": weights}
    )

    def refused(*_: object) -> int:
        raise PermissionError(1, "Operation not permitted")  # a seccomp that denies it

    monkeypatch.setattr(in_archive.os, "copy_file_range", refused)
    unpack_zip(archive, tmp_path / "out")
    assert (tmp_path / "out" / "ckpt" / "w.safetensors").read_bytes() == weights


def test_a_stored_member_whose_header_points_past_the_archive_is_refused(tmp_path: Path) -> None:
    archive = stored_zip(tmp_path / "c.zip", checkpoint_files(2 * MiB))
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo("ckpt/model.safetensors")
    # the local header's extra-field length now sends the data past the end of the file
    at = info.header_offset + 28
    data[at : at + 2] = (0xFFFF).to_bytes(2, "little")
    archive.write_bytes(bytes(data))
    with pytest.raises(InvalidRequest) as refused:
        unpack_zip(archive, tmp_path / "out")
    assert refused.value.details["reason"] == "bad_zip"
