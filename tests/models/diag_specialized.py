"""A dimension marked dynamic that the code forces to one size (reshape to 2x2)."""

import torch
from torch.export import Dim


class Square(torch.nn.Module):
    def forward(self, x):
        return x.reshape(2, 2)  # specializes dim 0 of x to 4


model = Square()
example_args = (torch.ones(4),)
dynamic_shapes = {"x": {0: Dim("n")}}
