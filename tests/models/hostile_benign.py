# The benign job run after every hostile one.
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x))


model = Model()
example_args = (torch.randn(2, 4),)
