"""A small MLP for the torchao schemes (their linears are the whole model); the batch is
dynamic up to 8."""

import torch
from torch import nn
from torch.export import Dim

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).eval()
example_args = (torch.randn(4, 256),)
dynamic_shapes = {"input": {0: Dim("batch", min=1, max=8)}}
