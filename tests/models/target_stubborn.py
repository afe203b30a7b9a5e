"""A model whose eager run never ends inside a deployment target's stage, and swallows
whatever is raised to stop it (a target's time budget too): only the job's own time
limit, enforced by the worker, stops it."""

import contextlib
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


class Stubborn(torch.nn.Module):
    def forward(self, x):
        while in_target_stage():
            with contextlib.suppress(BaseException):  # the point: it will not stop
                time.sleep(3600)
        return torch.relu(x) + 1


model = Stubborn()
example_args = (torch.randn(2, 8),)
