"""A tiny model using a layer of transformers (no weights, no download): the report's
environment lists transformers with its version. Tests skip it without transformers."""

import torch
from transformers.activations import GELUActivation


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.act = GELUActivation()

    def forward(self, x):
        return self.act(self.linear(x))


model = Block()
example_args = (torch.randn(2, 4),)
