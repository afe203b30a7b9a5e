"""Nested inputs (a list and a dict of tensors) and a keyword-only tensor."""

import torch


class Nested(torch.nn.Module):
    def forward(self, xs, d, *, scale):
        return xs[0] + xs[1] * d["a"] + scale


model = Nested()
example_args = ([torch.randn(3, 4), torch.randn(3, 4)], {"a": torch.randn(3, 4)})
example_kwargs = {"scale": torch.randn(3, 4)}
