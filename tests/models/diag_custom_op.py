"""Calls a custom operator that has no fake kernel (no register_fake)."""

import torch


@torch.library.custom_op("tp_diag::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class UsesCustomOp(torch.nn.Module):
    def forward(self, x):
        return twice(x) + 1


model = UsesCustomOp()
example_args = (torch.ones(3),)
