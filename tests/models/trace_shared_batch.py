"""Two inputs sharing their batch dimension."""

import torch
from torch.export import Dim


class SharedBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return self.linear(x) * y


model = SharedBatch()
example_args = (torch.randn(8, 4), torch.randn(8, 4))
batch = Dim("batch", max=64)
dynamic_shapes = {"x": {0: batch}, "y": {0: batch}}
