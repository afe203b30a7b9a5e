"""Warns while it is traced: the warning belongs in the report, with this file's line."""

import warnings

import torch


class Warns(torch.nn.Module):
    def forward(self, x):
        warnings.warn("scale is deprecated in this model, pass factor", UserWarning)
        return x * 2


model = Warns()
example_args = (torch.ones(3),)
