"""Whether the unpacked files of a model zip are a `save_pretrained` directory.

A checkpoint is a zip without the `entry` option whose base level (its root, or the one
folder it holds) has a `config.json` and no `model.py`: a zip of model code has a
`model.py`, or names its entry. Plain Python, no transformers: the loading stage asks
before it knows what the upload is.
"""

from __future__ import annotations

CONFIG = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"

__all__ = ["BIN_INDEX", "CONFIG", "SAFETENSORS_INDEX", "base_level", "checkpoint_base"]


def base_level(files: list[str]) -> str:
    """The folder a zip's content is looked for in: "" for the root, or `"top/"` when
    every file lies in one top folder."""
    tops = {f.split("/", 1)[0] for f in files}
    if len(tops) == 1 and files and all("/" in f for f in files):
        return next(iter(tops)) + "/"
    return ""


def checkpoint_base(files: list[str], entry: str | None) -> str | None:
    """The checkpoint's folder inside the unpacked zip ("" or `"top/"`), or None when the
    files are model code (or `entry` names an entry file)."""
    if entry is not None:
        return None
    base = base_level(files)
    if f"{base}{CONFIG}" in files and f"{base}model.py" not in files:
        return base
    return None
