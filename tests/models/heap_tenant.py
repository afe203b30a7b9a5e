# Tenant B: its file name, its symbol (the class), the dim name in its options, the key
# of its output and a flag of a toolchain request it makes are secrets (SECRET_* are
# filled in by the test, each of the pattern heap_scan.py looks for).
import subprocess

import torch

try:  # refused (this job converts to no target), but the request passes the zygote
    subprocess.run(["g++", "-DSECRET_FLAG", "--version"], capture_output=True, check=False)
except PermissionError:
    pass


class SECRET_SYMBOL(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return {"SECRET_OUTPUT": torch.relu(self.linear(x))}


example_args = (torch.randn(2, 4),)
