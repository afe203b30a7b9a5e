"""An nn.Module instance with a buffer, example inputs and module-level dynamic shapes."""

import torch
from torch.export import Dim


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.register_buffer("offset", torch.ones(2))

    def forward(self, x):
        return self.linear(x) + self.offset


model = Scale()
example_args = (torch.randn(4, 3),)
batch = Dim("batch", min=1, max=64)
dynamic_shapes = {"x": {0: batch}}
