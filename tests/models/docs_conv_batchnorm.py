import torch
from torch import nn


class ConvBatchnorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 1, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        return (x,)


model = ConvBatchnorm()  # train mode: batchnorm updates its running stats
example_args = (torch.randn(1, 1, 3, 3),)
