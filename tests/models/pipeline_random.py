"""Draws fresh noise on every call: the exported program cannot match eager."""

import torch


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


model = Noisy()
example_args = (torch.zeros(4, 4),)
