"""Several candidate models; the options pick one with `symbol`."""

import torch


class Plus(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Minus(torch.nn.Module):
    def forward(self, x):
        return x - 1


def helper(x):
    return x


plus = Plus()
minus = Minus()
not_a_model = 42
example_args = (torch.zeros(3),)
