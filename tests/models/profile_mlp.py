"""A small MLP for the profiling tests: converts to ONNX and ExecuTorch in seconds."""

import torch


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


model = Mlp().eval()
example_args = (torch.randn(4, 32),)
