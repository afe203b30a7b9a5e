"""A model that multiplies by a stacked (3-D) weight, as `bmm` against per-head or
per-expert weights does: ONNX Runtime's dynamic int8 MatMul takes per-channel parameters
of a 2-D weight only."""

import torch
from torch import nn


class StackedHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = nn.Parameter(torch.randn(4, 16, 16) / 4)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        per_head = torch.matmul(x.unsqueeze(1), self.heads)  # (batch, 4, rows, 16)
        return self.out(per_head.transpose(1, 2).flatten(2)).mean(1)


model = StackedHeads().eval()
example_args = (torch.randn(2, 8, 16),)
