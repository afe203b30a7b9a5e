# Hostile: grow the resident set in small steps (each below any single-allocation check).
import torch

TARGETS = {}
chunks = []
while True:
    chunks.append(bytearray(b"x" * (16 << 20)))


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
