# A custom op whose CompositeImplicitAutograd kernel grows a scratch buffer in place with
# resize_. torch.export keeps the op (it is a functional composite op) and runs the kernel
# under fake tensors without complaint, but run_decompositions, which inlines the kernel
# under functionalization, fails on the resize_ ("set the storage of a tensor on device
# cpu to a storage on device meta"). Keeping the op undecomposed lets it pass.
import torch
from torch import nn

try:
    torch.ops.tp_decomp.grow_shrink.default
except AttributeError:
    _lib = torch.library.Library("tp_decomp", "DEF")
    _lib.define("grow_shrink(Tensor x) -> Tensor")

    def _grow_shrink(x):
        scratch = x.new_empty(0)
        scratch.resize_(2 * x.numel())
        scratch[: x.numel()].copy_(x.flatten())
        return scratch[: x.numel()].view_as(x) * 2

    _lib.impl("grow_shrink", _grow_shrink, "CompositeImplicitAutograd")


class GrowShrink(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)

    def forward(self, x):
        y = torch.ops.tp_decomp.grow_shrink(self.lin(x))
        return self.norm(y).sum(-1)


model = GrowShrink()
example_args = (torch.randn(2, 3),)
