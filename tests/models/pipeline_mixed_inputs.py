"""Tensors, a dict of tensors, an int and a keyword mask; tracing fails (`data_dependent`)
after loading, so the report lists the inputs without a signature.json."""

import torch


class Mixed(torch.nn.Module):
    def forward(self, x, pair, scale, *, mask):
        y = x * scale + pair["a"] + pair["b"]
        if (y * mask).sum() > 0:  # a branch on values: export cannot trace it
            return y
        return -y


model = Mixed()
example_args = (torch.randn(2, 3), {"a": torch.ones(3), "b": torch.zeros(2, 3)}, 2)
example_kwargs = {"mask": torch.ones(2, 3, dtype=torch.bool)}
