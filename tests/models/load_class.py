"""An nn.Module subclass (instantiated with no arguments), with keyword example inputs."""

import torch


class Masked(torch.nn.Module):
    def forward(self, x, *, mask):
        return torch.where(mask, x, torch.zeros_like(x))


model = Masked
example_args = torch.randn(2, 3)  # a single tensor means a 1-tuple
example_kwargs = {"mask": torch.tensor([[True, False, True], [False, True, False]])}
