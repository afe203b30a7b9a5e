"""A small MLP for the service tests: exports in well under a second."""

import torch


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


model = Small()
example_args = (torch.randn(2, 8),)
