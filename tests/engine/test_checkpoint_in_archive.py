"""A checkpoint zip's stored safetensors are mapped where they lie in the zip, not unpacked
(`engine/load/checkpoint/in_archive.py`): the model is the same, nothing of the weights
is written to disk; a compressed or unreadable member is unpacked as before. torchport's
own zips align every member's data to 64 bytes so the weights always qualify."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from engine.load import loading
from engine.load.model import Upload
from schemas import ExportOptions
from schemas.model_zip import ALIGNMENT, aligned_member
from tests.engine.test_checkpoints import llama

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

OPTIONS = ExportOptions.model_validate({"task": "text-generation"})


def _data_offsets(archive: Path) -> dict[str, int]:
    with zipfile.ZipFile(archive) as zf, archive.open("rb") as raw:
        found = {}
        for info in zf.infolist():
            raw.seek(info.header_offset)
            header = raw.read(30)
            skip = int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
            found[info.filename] = info.header_offset + 30 + skip
        return found


def _zip(directory: Path, archive: Path, compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(archive, "w", compression) as zf:
        for path in sorted(directory.iterdir()):
            if compression == zipfile.ZIP_STORED:
                info = aligned_member(path.name, zf.fp.tell() if zf.fp else 0)
                with zf.open(info, "w", force_zip64=True) as out:
                    out.write(path.read_bytes())
            else:
                zf.write(path, path.name)
    return archive


def test_aligned_members_start_their_data_at_multiples_of_64(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    names = ["config.json", "model.safetensors", "x" * 77 + ".json", "ünïcode.bin"]
    with zipfile.ZipFile(archive, "w") as zf:
        for index, name in enumerate(names):
            with zf.open(
                aligned_member(name, zf.fp.tell() if zf.fp else 0), "w", force_zip64=True
            ) as out:
                out.write(bytes([index]) * (1000 + 37 * index))
    assert all(offset % ALIGNMENT == 0 for offset in _data_offsets(archive).values())
    with zipfile.ZipFile(archive) as zf:
        assert zf.testzip() is None  # CRCs and sizes as written
        assert zf.read(names[3]) == bytes([3]) * (1000 + 37 * 3)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def test_stored_weights_are_mapped_from_the_zip_and_load_the_same(tmp_path: Path) -> None:
    directory = llama(tmp_path)
    stored = _zip(directory, tmp_path / "stored.zip")
    deflated = _zip(directory, tmp_path / "deflated.zip", zipfile.ZIP_DEFLATED)
    mapped = loading.load(Upload(model=stored), OPTIONS, tmp_path / "w1", reference=False)
    maps = Path("/proc/self/maps").read_text()
    assert str(stored) in maps  # the weights are views of the zip's mapping
    assert not (tmp_path / "w1" / "src" / "model.safetensors").exists()
    assert (tmp_path / "w1" / "src" / "config.json").is_file()
    unpacked = loading.load(Upload(model=deflated), OPTIONS, tmp_path / "w2", reference=False)
    assert (tmp_path / "w2" / "src" / "model.safetensors").is_file()
    assert str(deflated) not in Path("/proc/self/maps").read_text()
    ours, theirs = _weights(mapped.generation.model), _weights(unpacked.generation.model)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert mapped.checkpoint is not None and unpacked.checkpoint is not None
    assert (
        mapped.checkpoint.weights_files
        == unpacked.checkpoint.weights_files
        == ["model.safetensors"]
    )
    assert mapped.checkpoint.newly_initialized == unpacked.checkpoint.newly_initialized
    config = mapped.generation.model.generation_config
    assert config.to_dict() == unpacked.generation.model.generation_config.to_dict()


def test_a_member_whose_header_does_not_parse_is_unpacked(tmp_path: Path) -> None:
    directory = llama(tmp_path)
    (directory / "model.safetensors").write_bytes(b"\xff" * 64)  # no safetensors header
    archive = _zip(directory, tmp_path / "broken.zip")
    with pytest.raises(Exception) as raised:
        loading.load(Upload(model=archive), OPTIONS, tmp_path / "w", reference=False)
    assert getattr(raised.value, "code", None) == "invalid_inputs"
    assert (tmp_path / "w" / "src" / "model.safetensors").read_bytes() == b"\xff" * 64


def test_the_clis_zip_is_aligned(tmp_path: Path) -> None:
    from torchport.checkpoints import zip_checkpoint

    archive, _ = zip_checkpoint(llama(tmp_path), tmp_path)
    offsets = _data_offsets(archive)
    assert offsets and all(offset % ALIGNMENT == 0 for offset in offsets.values())
