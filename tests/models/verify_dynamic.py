"""Derived dims, an unbounded dim, a keyword input and a buffer mutated in place."""

import torch
from torch.export import Dim


class Accumulator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x, y, *, mask):
        self.calls.add_(1)
        return {"sum": self.linear(x).sum(0) + y[1:].sum(0), "masked": mask.float() * self.calls}


model = Accumulator()
dimx = Dim("dimx", min=3, max=6)
example_args = (torch.randn(4, 4), torch.randn(5, 4))
example_kwargs = {"mask": torch.ones(3, dtype=torch.bool)}
dynamic_shapes = {"x": {0: dimx}, "y": {0: dimx + 1}, "mask": {0: Dim("m", min=2)}}
