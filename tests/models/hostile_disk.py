# Hostile: write 10 GB into the scratch directory.
import os, tempfile
import torch

block = b"\0" * (1 << 20)
with open(os.path.join(tempfile.gettempdir(), "big"), "wb") as handle:
    for _ in range(10 * 1024):
        handle.write(block)


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
