"""The versions and machine an export ran on, for the report."""

from __future__ import annotations

import platform
import sys

import torch

from schemas import Environment


def describe(device: str) -> Environment:
    """Versions of torchport, torch and Python, the platform, and the GPU when used."""
    from torchport import __version__

    gpu = None
    cuda = None
    if device == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
        cuda = torch.version.cuda
    return Environment(
        torchport=__version__,
        torch=torch.__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        device=device,
        cuda=cuda,
        gpu=gpu,
    )
