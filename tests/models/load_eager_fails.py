"""Imports fine, but its forward fails on the example inputs (a shape mismatch)."""

import torch


class Project(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(5, 2))

    def forward(self, x):
        y = x.relu()
        return y @ self.weight  # LINE: matmul


model = Project()
example_args = (torch.randn(4, 3),)
