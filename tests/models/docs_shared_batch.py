import torch
from torch import nn


class M(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch1 = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.branch2 = nn.Sequential(nn.Linear(128, 64), nn.ReLU())
        self.buffer = nn.Buffer(torch.ones(32))

    def forward(self, x1, x2):
        out1 = self.branch1(x1)
        out2 = self.branch2(x2)
        return (out1 + self.buffer, out2)


model = M()
example_args = (torch.randn(32, 64), torch.randn(32, 128))
