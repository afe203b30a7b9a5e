"""Whether the unpacked files of a model zip are a `save_pretrained` directory.

A checkpoint is a zip without the `entry` option whose base level (its root, or the one
folder it holds) has a `config.json` and no `model.py`: a zip of model code has a
`model.py`, or names its entry. The rule is the contract's (`schemas.model_zip`), which
the API applies to the zip's directory too; no transformers needed. A zip whose base
level holds a PEFT adapter and no `config.json` lacks its base (`adapter_only_base`).
"""

from __future__ import annotations

from schemas.model_zip import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CONFIG,
    adapter_only_base,
    base_level,
    checkpoint_base,
)

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "BIN_INDEX",
    "CONFIG",
    "SAFETENSORS_INDEX",
    "adapter_only_base",
    "base_level",
    "checkpoint_base",
]
