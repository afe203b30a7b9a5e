"""Weights that are views of a private file mapping, and giving their pages back.

A checkpoint's weights mapped from its zip (`engine.load.checkpoint.in_archive`) and a
saved program's weights mapped from `program.pt2` (`engine.serialize.mapped`) are views
of one copy-on-write mapping of the file (`mmap.ACCESS_COPY`): a page is the page cache's
until something writes it, and nothing does. `MADV_DONTNEED` on such a page takes it out
of the process (its resident size, where the job's memory is counted); a later read
faults it in again from the file, with the same bytes. So a stage that is done with a
weight can give its pages back and hold about one layer's weights at a time.

`Mapping.release` gives back only whole pages inside a tensor's storage, and only of a
tensor that lies in the mapping: the pages of anything else (heap memory, whose
`MADV_DONTNEED` would zero it) are never touched. Mappings made for a checkpoint are
`register`ed, so `release(tensor)` finds the one a weight lies in, if any.

Torch only: the round trip's fresh process imports this.
"""

from __future__ import annotations

import mmap

import torch

__all__ = ["Mapping", "register", "release"]


class Mapping:
    """A private file mapping that weights are views of."""

    def __init__(self, mapping: mmap.mmap, base: int | None = None) -> None:
        self.mapping = mapping
        self.base = base
        """The mapping's address (None until known: set from the first view made of it)."""

    def _offset(self, tensor: torch.Tensor) -> int | None:
        """Where `tensor`'s storage starts in the mapping, or None when not in it."""
        if self.base is None:
            return None
        start = tensor.untyped_storage().data_ptr() - self.base
        return start if 0 <= start < len(self.mapping) else None

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s storage lies in the mapping."""
        return self._offset(tensor) is not None

    def release(self, tensor: torch.Tensor) -> bool:
        """Give back the whole pages of `tensor`'s storage (read again if used again);
        whether it lies in the mapping."""
        start = self._offset(tensor)
        if start is None:
            return False
        end = min(start + tensor.untyped_storage().nbytes(), len(self.mapping))
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        last = end // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            self.mapping.madvise(mmap.MADV_DONTNEED, first, last - first)
        return True


_REGISTERED: list[Mapping] = []


def register(mapping: Mapping) -> Mapping:
    """Make `release` look in `mapping` (kept as long as the process: a job's mappings
    live as long as its model)."""
    _REGISTERED.append(mapping)
    return mapping


def release(tensor: torch.Tensor) -> bool:
    """Give back the pages of `tensor` when it lies in a registered mapping; whether it
    does (a tensor in memory of its own is left as it is)."""
    if tensor.device.type != "cpu" or tensor.is_meta:
        return False
    return any(mapping.release(tensor) for mapping in _REGISTERED)
