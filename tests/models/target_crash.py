"""A model whose eager run aborts the process (SIGABRT, as a runtime's C++
`std::terminate` does) inside a deployment target's stage, and runs normally elsewhere:
a job whose process crashes while converting, after program.pt2 was saved."""

import os
import sys

import torch


def in_target_stage() -> bool:
    """Whether engine.targets (a target's verification) is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if "/engine/targets/" in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


class Crashing(torch.nn.Module):
    def forward(self, x):
        if in_target_stage():
            os.abort()
        return torch.relu(x) + 1


model = Crashing()
example_args = (torch.randn(2, 8),)
