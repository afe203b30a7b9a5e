"""A checkpoint's safetensors weights read where they lie in the uploaded zip: mapped, not
unpacked.

A checkpoint zip usually stores its safetensors uncompressed (`torchport export DIR`,
`torchport submit DIR` and a reference's zip always do, 64-byte aligned). Such a member
at the checkpoint's base level is not copied out (for a 2.47 GB checkpoint: 2.47 GB less
written and kept on disk); its tensors are views of one copy-on-write mapping of the zip
(`mmap.ACCESS_COPY`: the weights' pages are the zip's page cache, and a write, which
nothing should make, stays private to the process) and the model is built from them
(`from_pretrained(None, config, state_dict=…)`). A member that is compressed, whose
header does not parse or whose tensors are not aligned to their element size is unpacked
as before, and so are all the others of that checkpoint then (one way to load it).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from engine.load import pages

__all__ = [
    "Kept",
    "archived",
    "copy_range",
    "keep",
    "readable",
    "state_dict",
    "stored_start",
    "unpack_all",
]

_LOCAL_HEADER = 30
_MAX_HEADER = 100 * 1024 * 1024
"""safetensors' own bound on a file's JSON header."""
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class Kept:
    """A safetensors member left in its zip: where its bytes start, and its tensors."""

    archive: Path
    start: int
    size: int
    header: dict[str, Any]
    data: int
    """Where the tensors' bytes start in the archive."""


_KEPT: dict[Path, Kept] = {}
"""By the path the member would have been unpacked to (this process's jobs)."""


def stored_start(src: BinaryIO, info: zipfile.ZipInfo) -> int | None:
    """Where a stored (uncompressed, unencrypted) member's bytes start in the open archive
    `src`, as its local header says, when they lie inside the archive; None otherwise."""
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        return None
    if info.flag_bits & 0x1:  # encrypted: zipfile refuses it
        return None
    src.seek(info.header_offset)
    local = src.read(_LOCAL_HEADER)
    if len(local) != _LOCAL_HEADER or local[:4] != b"PK\x03\x04":
        return None
    names, extra = struct.unpack("<HH", local[26:30])
    start = info.header_offset + _LOCAL_HEADER + names + extra
    if start + info.file_size > os.fstat(src.fileno()).st_size:
        return None
    return start


def copy_range(source: int, dest: int, offset: int, size: int) -> None:
    """Copy `size` bytes from `offset` of the file `source` to `dest`, in the kernel
    (`copy_file_range`).

    Raises:
        OSError: the kernel refused, or copied nothing.
    """
    while size:
        done = os.copy_file_range(source, dest, size, offset)
        if done <= 0:
            raise OSError("copy_file_range copied nothing")
        size, offset = size - done, offset + done


def readable(archive: Path, info: zipfile.ZipInfo) -> Kept | None:
    """The member as a `Kept` when it can be read in place: stored, not encrypted, inside
    the archive, a safetensors header that parses, every tensor inside the member and
    aligned to its element size; None otherwise."""
    size = info.file_size
    if size < 8:
        return None
    try:
        with archive.open("rb") as src:
            start = stored_start(src, info)
            if start is None:
                return None
            src.seek(start)
            (length,) = struct.unpack("<Q", src.read(8))
            if length > min(_MAX_HEADER, size - 8):
                return None
            header = json.loads(src.read(length))
    except (OSError, ValueError, struct.error):
        return None
    if not isinstance(header, dict):
        return None
    data = start + 8 + length
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if not _sound(meta, data, start + size):
            return None
    return Kept(archive, start, size, header, data)


def _sound(meta: Any, data: int, end: int) -> bool:
    try:
        dtype = _DTYPES[meta["dtype"]]
        begin, finish = (int(x) for x in meta["data_offsets"])
        count = 1
        for dim in meta["shape"]:
            count *= int(dim)
    except (KeyError, TypeError, ValueError):
        return False
    return (
        0 <= begin <= finish
        and data + finish <= end
        and (finish - begin) == count * dtype.itemsize
        and (data + begin) % dtype.itemsize == 0
    )


def keep(target: Path, kept: Kept) -> None:
    """Note that `target` is read from its zip instead of unpacked."""
    _KEPT[target.resolve()] = kept


def archived(directory: Path) -> dict[str, Kept]:
    """The files of `directory` (by name) kept in their zip."""
    folder = directory.resolve()
    return {path.name: kept for path, kept in _KEPT.items() if path.parent == folder}


def unpack_all(directory: Path) -> None:
    """Copy out the files of `directory` kept in their zip (a checkpoint loaded another
    way than from a state dict)."""
    for name, kept in archived(directory).items():
        target = directory / name
        with kept.archive.open("rb") as src, target.open("wb") as out:
            copy_range(src.fileno(), out.fileno(), kept.start, kept.size)
        del _KEPT[target.resolve()]


def state_dict(kept: list[Kept]) -> dict[str, torch.Tensor]:
    """The tensors of the kept members: views of one copy-on-write mapping per zip, each
    registered with `engine.load.pages` (a stage done with a weight may give its pages
    back)."""
    maps: dict[Path, mmap.mmap] = {}
    tensors: dict[str, torch.Tensor] = {}
    for item in kept:
        if item.archive not in maps:
            with item.archive.open("rb") as handle:
                maps[item.archive] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            start = torch.frombuffer(maps[item.archive], dtype=torch.uint8, count=1)
            pages.register(pages.Mapping(maps[item.archive], base=start.data_ptr()))
        mapping = maps[item.archive]
        for name, meta in item.header.items():
            if name == "__metadata__":
                continue
            dtype = _DTYPES[meta["dtype"]]
            begin, finish = meta["data_offsets"]
            flat = (
                torch.frombuffer(
                    mapping,
                    dtype=dtype,
                    count=(finish - begin) // dtype.itemsize,
                    offset=item.data + begin,
                )
                if finish > begin
                else torch.empty(0, dtype=dtype)
            )
            tensors[name] = flat.view(meta["shape"])
    return tensors
