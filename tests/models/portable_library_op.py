"""Calls a custom operator the upload registers at import (with a fake kernel, so it
traces): the program saves, but a process that imported only torch cannot load it."""

import torch


@torch.library.custom_op("tp_portable::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UsesRegisteredOp(torch.nn.Module):
    def forward(self, x):
        return scale(x) + 1


model = UsesRegisteredOp()
example_args = (torch.ones(2, 3),)
