import torch
from torch import nn
from torch.export import Dim


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).relu()


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Inner(), Inner())

    def forward(self, x, extras, scale=1.0, bias=None):
        z = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
        out = self.blocks(z) * scale + extras["pair"][1]
        return out + bias, {"first": extras["pair"][0] * 2}


model = Nested()
example_args = (torch.randn(3, 4), {"pair": [torch.randn(4), torch.randn(4)]})
example_kwargs = {"scale": 2.0, "bias": torch.randn(4)}
batch = Dim("batch", min=2, max=64)
dynamic_shapes = {"x": {0: batch}, "extras": {"pair": [None, None]}, "scale": None, "bias": None}
