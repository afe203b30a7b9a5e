"""Branches on a value read with `.item()`: an unbacked symbol (u0) in both modes."""

import torch


class BranchOnItem(torch.nn.Module):
    def forward(self, x):
        n = x.max().item()
        if n > 3:  # guard on the unbacked symbol
            return x + 1
        return x


model = BranchOnItem()
example_args = (torch.tensor([5, 1]),)
