"""A small transformer block with a dynamic batch and sequence length.

    torchport export examples/tiny_transformer.py --out out
"""

import torch
from torch import nn
from torch.export import Dim


class Block(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


model = Block().eval()
example_args = (torch.randn(2, 16, 32),)
dynamic_shapes = {"x": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=128)}}
