"""`model` is neither a module, a module class nor a function; `get_model` is absent."""

import torch


class Net(torch.nn.Module):
    def forward(self, x):
        return x


net = Net()
model = 42
example_args = (torch.zeros(1),)
