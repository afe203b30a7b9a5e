"""A branch on a tensor's values with a batch of rows: torchport proposes `batch` for dim 0
of `x`, which has nothing to do with the `data_dependent` failure."""

import torch


class RowGate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # the data-dependent branch
            return x.sin()
        return x.cos()


model = RowGate()
example_args = (torch.randn(4, 3),)
