import torch
from torch.export import Dim


class M(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] > 5:
            return x.sin()
        return x.cos()


model = M()
example_args = (torch.randn(8, 4),)
dynamic_shapes = {"x": {0: Dim("batch", min=2, max=16)}}
