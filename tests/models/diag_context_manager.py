"""Takes a threading lock in forward: dynamo (strict) cannot trace it; non-strict can."""

import threading

import torch


class Locked(torch.nn.Module):
    def forward(self, x):
        with threading.Lock():
            return x + 1


model = Locked()
example_args = (torch.ones(3),)
