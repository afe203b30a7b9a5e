"""A model whose import sleeps, so a job stays running long enough to cancel or kill.

The sleep length comes from the uploaded options' file name: tests copy this file as
`slow_<seconds>.py`.
"""

import pathlib
import time

import torch

_name = pathlib.Path(__file__).stem
time.sleep(float(_name.split("_")[-1]) if _name.startswith("slow_") else 4.0)


class Slow(torch.nn.Module):
    def forward(self, x):
        return x + 1


model = Slow()
example_args = (torch.randn(2, 2),)
