"""A plain function of tensors as the model."""

import torch


def model(x, y, scale=2.0):
    return x * scale + y


example_args = (torch.randn(2, 3), torch.randn(2, 3))
