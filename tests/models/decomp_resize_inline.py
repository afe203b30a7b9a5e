# The same in-place resize_ as decomp_custom_op.py, written in forward itself: no op can be
# kept undecomposed to avoid it, so run_decompositions fails whatever the table.
import torch
from torch import nn


class ResizeInline(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        scratch = x.new_empty(0)
        scratch.resize_(2 * x.numel())
        scratch[: x.numel()].copy_(x.flatten())
        return self.lin(scratch[: x.numel()].view_as(x))


model = ResizeInline()
example_args = (torch.randn(2, 3),)
