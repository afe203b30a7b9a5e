"""A plain module whose example batch is 1: declared dynamic, torch pins it to 1."""

import torch


class Rows(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x).relu() + x.sum(0)


model = Rows()
example_args = (torch.randn(1, 4),)
