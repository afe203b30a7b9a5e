"""Branches on a tensor's value: data-dependent in both strict and non-strict export."""

import torch


class BranchOnSum(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # the data-dependent branch
            return x + 1
        return x - 1


model = BranchOnSum()
example_args = (torch.ones(3),)
