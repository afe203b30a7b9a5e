# Hostile: allocate 100 GB.
import torch

hog = bytearray(100 << 30)


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
