"""Raises from user code only when traced: non-strict export passes FakeTensors in."""

import torch


class PlainOnly(torch.nn.Module):
    def forward(self, x):
        if type(x) is not torch.Tensor:
            raise ValueError("only plain tensors")
        return x + 1


model = PlainOnly()
example_args = (torch.ones(3),)
