"""Uploaded weights: a state dict in `.safetensors` or `.pt` (read with `weights_only=True`).

The state dict must match the model exactly: missing keys, unexpected keys and shape
mismatches are all reported together in one `WeightsMismatch`.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from engine.errors import InvalidInputs, WeightsMismatch
from engine.inputs import detect_format

STAGE = "loading"


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read a state dict from `.safetensors` or `.pt` onto the CPU.

    A `.pt` holding `{"state_dict": {...}, ...}` (a training checkpoint) is accepted too.

    Raises:
        InvalidInputs: the file is unreadable, holds a pickle payload, or is not a
            mapping of names to tensors.
    """
    fmt = detect_format(path)
    obj: Any
    try:
        if fmt == "safetensors":
            obj = safetensors.torch.load_file(str(path), device="cpu")
        elif fmt == "pt":
            # weights_only=True passed explicitly: no environment variable can turn it off.
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        else:
            raise InvalidInputs(
                "The weights file is not .safetensors or .pt.",
                stage=STAGE,
                details={"source": "weights", "file": path.name},
            )
    except pickle.UnpicklingError as exc:
        raise InvalidInputs(
            "The weights file holds Python objects other than tensors; it was refused "
            "without being unpickled.",
            hint="Save `model.state_dict()` only, preferably with safetensors.",
            stage=STAGE,
            details={
                "source": "weights",
                "format": fmt,
                "exception": type(exc).__name__,
                "pickle_refused": True,
            },
        ) from exc
    except InvalidInputs:
        raise
    except Exception as exc:
        raise InvalidInputs(
            "The weights file cannot be read.",
            stage=STAGE,
            details={"source": "weights", "format": fmt, "exception": type(exc).__name__},
        ) from exc
    if (
        isinstance(obj, Mapping)
        and isinstance(obj.get("state_dict"), Mapping)
        and not all(isinstance(v, torch.Tensor) for v in obj.values())
    ):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise InvalidInputs(
            "The weights file does not hold a state dict.",
            stage=STAGE,
            details={"source": "weights", "format": fmt, "got": type(obj).__name__},
        )
    bad = sorted(str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor))
    if bad:
        raise InvalidInputs(
            "Some entries of the weights file are not tensors.",
            stage=STAGE,
            details={"source": "weights", "format": fmt, "not_tensors": bad[:50]},
        )
    return {str(k): v for k, v in obj.items()}


def load_weights(module: torch.nn.Module, path: Path) -> None:
    """Load the state dict at `path` into `module`, strictly.

    Raises:
        InvalidInputs: the file cannot be read as a state dict.
        WeightsMismatch: keys are missing or unexpected, or shapes differ; details hold
            `missing`, `unexpected` and `shape_mismatch` (`key`, `expected`, `got`).
    """
    state = read_state_dict(path)
    expected = module.state_dict()
    shape_mismatch = [
        {"key": key, "expected": list(expected[key].shape), "got": list(tensor.shape)}
        for key, tensor in state.items()
        if key in expected and expected[key].shape != tensor.shape
    ]
    if shape_mismatch:
        # load_state_dict stops at the first size mismatch; report the key diff alongside.
        raise _mismatch(
            missing=sorted(set(expected) - set(state)),
            unexpected=sorted(set(state) - set(expected)),
            shape_mismatch=shape_mismatch,
        )
    try:
        # strict=False so the result lists keys after the module's own load hooks ran;
        # any difference is then refused exactly as strict=True would.
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise _mismatch(
            missing=sorted(set(expected) - set(state)),
            unexpected=sorted(set(state) - set(expected)),
            shape_mismatch=[],
            exception=type(exc).__name__,
        ) from exc
    if result.missing_keys or result.unexpected_keys:
        raise _mismatch(
            missing=sorted(result.missing_keys),
            unexpected=sorted(result.unexpected_keys),
            shape_mismatch=[],
        )


def _mismatch(
    *,
    missing: list[str],
    unexpected: list[str],
    shape_mismatch: list[dict[str, Any]],
    exception: str | None = None,
) -> WeightsMismatch:
    details: dict[str, Any] = {
        "missing": missing,
        "unexpected": unexpected,
        "shape_mismatch": shape_mismatch,
    }
    if exception is not None:
        details["exception"] = exception
    parts = [
        f"{len(missing)} missing" if missing else "",
        f"{len(unexpected)} unexpected" if unexpected else "",
        f"{len(shape_mismatch)} of another shape" if shape_mismatch else "",
    ]
    summary = ", ".join(p for p in parts if p) or "a mismatch"
    return WeightsMismatch(
        f"The uploaded weights do not match the model: {summary}.",
        stage=STAGE,
        details=details,
    )
