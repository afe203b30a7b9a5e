"""The versions and machine an export ran on, for the report."""

from __future__ import annotations

import platform
import sys

import torch

from schemas import Environment


def describe(device: str, libraries: dict[str, str] | None = None) -> Environment:
    """Versions of torchport, torch and Python, the platform, the GPU when used, and the
    third-party `libraries` the upload imported (torch always among them)."""
    from schemas.version import __version__

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
        libraries=dict(
            sorted({**(libraries or {}), "torch": torch.__version__}.items(), key=_lowercase)
        ),
    )


def _lowercase(item: tuple[str, str]) -> str:
    return item[0].lower()
