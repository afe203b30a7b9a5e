"""Calls a C builtin dynamo cannot trace (strict fails), harmless for non-strict export."""

import pickle

import torch


class PicklesInForward(torch.nn.Module):
    def forward(self, x):
        return x + len(pickle.dumps([1, 2]))


model = PicklesInForward()
example_args = (torch.randn(2, 3),)
