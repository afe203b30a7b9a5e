"""Returns a user namedtuple: torch.export.save cannot name it."""

from typing import NamedTuple

import torch


class Pair(NamedTuple):
    total: torch.Tensor
    diff: torch.Tensor


class M(torch.nn.Module):
    def forward(self, x, y):
        return Pair(x + y, x - y)


model = M()
example_args = (torch.ones(2), torch.ones(2))
