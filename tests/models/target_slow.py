"""A model whose eager runs take 3 s inside a deployment target's stage (its
verification against eager), instantly elsewhere: a target that outlasts a small
`target_timeout_s` whatever the machine's speed."""

import sys
import time

import torch


def in_target_stage() -> bool:
    """Whether engine.targets (a target's verification) is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if "/engine/targets/" in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


class Slow(torch.nn.Module):
    def forward(self, x):
        if in_target_stage():
            time.sleep(3)
        return torch.relu(x) + 1


model = Slow()
example_args = (torch.randn(2, 8),)
