"""Module classes that cannot be built with no arguments."""

import torch


class NeedsArgs(torch.nn.Module):  # LINE: needs_args
    def __init__(self, width):
        super().__init__()
        self.width = width

    def forward(self, x):
        return x


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        raise RuntimeError("cannot build")  # LINE: broken

    def forward(self, x):
        return x


model = NeedsArgs
example_args = (torch.zeros(1),)
