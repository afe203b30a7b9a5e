"""torch.export docs' derived-dims case: y is one longer than x, which the spec misses."""

import torch
from torch.export import Dim


class DerivedDims(torch.nn.Module):
    def forward(self, x, y):
        return x + y[1:]


model = DerivedDims()
example_args = (torch.randn(5, 3), torch.randn(6, 3))
dx = Dim("dx", min=3, max=6)
dy = Dim("dy")
dynamic_shapes = {"x": {0: dx}, "y": {0: dy}}
