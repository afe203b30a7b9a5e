import torch
from torch import nn


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()


model = ConvBn()  # train mode: batchnorm updates running_mean, running_var, num_batches_tracked
example_args = (torch.randn(2, 3, 8, 8),)
