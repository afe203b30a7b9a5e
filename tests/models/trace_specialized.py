"""Code that specializes its first dim to the example's size (4)."""

import torch


class Specialized(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 4:
            return x + 1
        return x - 1


model = Specialized()
example_args = (torch.randn(4, 3),)
