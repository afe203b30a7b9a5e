"""A small CNN for option `quantize`: conv and linear weights dominate its size, as in
the vision models int8 is for; the batch is dynamic up to 8."""

import torch
from torch import nn
from torch.export import Dim


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.head = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
        return self.head(x.flatten(1))


torch.manual_seed(0)
model = SmallCnn().eval()
example_args = (torch.randn(2, 3, 32, 32),)
dynamic_shapes = {"x": {0: Dim("batch", min=1, max=8)}}
