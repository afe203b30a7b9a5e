"""A model without `example_args` (inputs must come from an uploaded file)."""

import torch


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x, bias=None):
        out = self.linear(x)
        return out if bias is None else out + bias


model = Affine()
