"""A stand-in for an installed model library: a module outside the upload and outside
torch, on the import path as `tests/engine/library_blocks.py`."""

from __future__ import annotations

import torch


class Block(torch.nn.Module):
    """A projection then a GELU, as a library's layer would be written."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.proj(x)  # PROJECTION
        return torch.nn.functional.gelu(hidden)  # ACTIVATION
