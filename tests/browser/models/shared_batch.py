"""Two inputs that share one dynamic batch dimension; the browser tests' happy path."""

import torch
from torch import nn


class TwoTowers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        self.right = nn.Sequential(nn.Linear(6, 3), nn.Tanh())

    def forward(self, image, text):
        return self.left(image) + self.right(text)


model = TwoTowers()
example_args = (torch.randn(2, 4), torch.randn(2, 6))
