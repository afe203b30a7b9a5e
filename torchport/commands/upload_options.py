"""The options `torchport export` and `torchport submit` share: what to upload, and how."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_upload_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, its inputs and weights files, and the export options (CONTRACT.md §6)."""
    parser.add_argument("model", type=Path, help="the model source: a .py file or a .zip")
    parser.add_argument("--inputs", type=Path, help="example inputs: .safetensors, .pt or .json")
    parser.add_argument("--weights", type=Path, help="state dict: .safetensors or .pt")
    parser.add_argument("--options", help="export options: JSON text or a .json file")
    parser.add_argument("--dynamic-shapes", help="dynamic shapes: JSON text or a .json file")
    parser.add_argument("--strict", action="store_true", help="trace with strict=True")
