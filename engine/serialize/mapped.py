"""Loading a saved program with its weights mapped from the file, not read into memory.

`torch.export.load` reads every weight record of a `.pt2` into memory
(`torch.export.pt2_archive._package._build_file_map`): a 2.5 GB program costs 2.5 GB of
anonymous memory in the loading process, on top of the file's pages in the page cache.
Within `mapped_weights(path)` the records are instead views of one private, copy-on-write
mapping of the file (the records are stored uncompressed, aligned to 64 bytes): the
pages are the page cache's, read as the program runs, and nothing is copied. Everything
else of the load is torch's own. Files under `MAPPED_FROM_BYTES` load as torch loads them.

Torch only: the round trip's fresh process imports this.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.export.pt2_archive import _package

__all__ = ["MAPPED_FROM_BYTES", "mapped_weights"]

MAPPED_FROM_BYTES = 64 << 20
"""Programs at least this big have their weights mapped."""


@contextlib.contextmanager
def mapped_weights(path: str | os.PathLike[str]) -> Iterator[None]:
    """Within it, `torch.export.load(path)` maps the weights of the file at `path`."""
    if os.path.getsize(path) < MAPPED_FROM_BYTES:
        yield
        return
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    original = _package._build_file_map

    def build(archive_reader: Any, config: Any, base_dir: str) -> dict[str, torch.Tensor]:
        file_map: dict[str, torch.Tensor] = {}
        reader = archive_reader.archive_file
        for meta in config.config.values():
            if meta.use_pickle or meta.path_name in file_map or meta.tensor_meta is None:
                continue
            tensor_meta = meta.tensor_meta
            dtype = _package.deserialize_scalar_type(tensor_meta.dtype)
            device = _package.deserialize_device(tensor_meta.device)
            record = os.path.join(base_dir, meta.path_name)
            nbytes = reader.get_record_size(record)
            size = torch._utils._element_size(dtype)
            offset = reader.get_record_offset(record) if nbytes else 0
            if nbytes == 0 or device.type != "cpu" or nbytes % size or offset % size:
                return original(archive_reader, config, base_dir)  # torch's own way
            flat = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset)
            tensor = flat.view(dtype)
            if tensor_meta.requires_grad:
                tensor.requires_grad_(True)
            file_map[meta.path_name] = tensor
        return file_map

    _package._build_file_map = build
    try:
        yield
    finally:
        _package._build_file_map = original
