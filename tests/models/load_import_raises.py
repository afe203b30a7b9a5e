"""Raises while being imported, from a helper function."""

import torch


def configure():
    raise ValueError("bad configuration")  # LINE: raise


configure()
model = torch.nn.Identity()
