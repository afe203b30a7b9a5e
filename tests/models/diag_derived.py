"""Two independent dims that the code relates (x[1:] + y): torch suggests dx = dy + 1."""

import torch
from torch.export import Dim


class Shifted(torch.nn.Module):
    def forward(self, x, y):
        return x[1:] + y


model = Shifted()
example_args = (torch.ones(4), torch.ones(3))
dynamic_shapes = {"x": {0: Dim("dx", min=3, max=6)}, "y": {0: Dim("dy")}}
