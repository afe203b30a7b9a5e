# Hostile: flood stdout and stderr (50 MB each).
import sys
import torch

line = "x" * 1023 + "\n"
for _ in range(50 * 1024):
    sys.stdout.write(line)
    sys.stderr.write(line)


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
