"""Reads a data pointer in forward: fake tensors have none, so both modes fail."""

import torch


class Pointer(torch.nn.Module):
    def forward(self, x):
        return x + (x.data_ptr() % 2)


model = Pointer()
example_args = (torch.ones(3),)
