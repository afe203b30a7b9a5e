"""Indexes with an integer tensor: small sampled sizes make the eager model raise."""

import torch
from torch.export import Dim


class Gather(torch.nn.Module):
    def forward(self, x, index):
        return x[index] * 2


model = Gather()
example_args = (torch.randn(8, 3), torch.tensor([0, 7, 3]))
dynamic_shapes = {"x": {0: Dim("rows", min=2, max=16)}, "index": None}
