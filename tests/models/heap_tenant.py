# Tenant B: its file name, its symbol (the class), the dim name in its options and the
# key of its output are secrets (SECRET_* are filled in by the test, each of the pattern
# heap_scan.py looks for).
import torch


class SECRET_SYMBOL(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return {"SECRET_OUTPUT": torch.relu(self.linear(x))}


example_args = (torch.randn(2, 4),)
