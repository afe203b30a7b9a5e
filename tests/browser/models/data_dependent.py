"""A branch on a tensor's values: export fails with `data_dependent` at the `if` line."""

import torch


class Gate(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        if y.sum() > 0:  # the data-dependent branch
            return y.sin()
        return y.cos()


model = Gate()
example_args = (torch.randn(3),)
