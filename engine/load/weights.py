"""Uploaded weights: a state dict in `.safetensors` or `.pt`/`.pth` (read with
`weights_only=True`), or a training checkpoint holding one under a conventional key.

With option `weights.strict` (the default) the state dict must match the model exactly:
missing keys, unexpected keys and shape mismatches are all reported together in one
`WeightsMismatch`. With `strict: false` the tensors whose names match are loaded and the
others are named in `report.weights` and warning `weights_skipped`; shapes must match
either way, and at least one name.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from engine.errors import InvalidInputs, WeightsMismatch
from engine.load.inputs import detect_format
from schemas import ReportWarning, WeightsOptions, WeightsReport
from schemas.upload_report import WEIGHTS_MAX_LISTED

STAGE = "loading"

NESTED_KEYS = ("state_dict", "model_state_dict", "model_state", "model", "net")
"""Where training checkpoints keep the model's state dict (Lightning, the PyTorch
tutorials' `model_state_dict`, fairseq's and torchvision's `model`, …), in the order tried."""
WARNING_LISTED = 20
"""Names listed in warning `weights_skipped`; `report.weights` lists more."""


@dataclass(frozen=True)
class StateDict:
    """The state dict read from a weights file, and where in the file it was."""

    tensors: dict[str, torch.Tensor]
    format: str
    key: str | None = None
    """The top-level key it was read from; None: the file is the state dict."""


def read_state_dict(path: Path, key: str | None = None) -> StateDict:
    """Read a state dict from `.safetensors` or `.pt` onto the CPU.

    A `.pt` holding a training checkpoint (`{"model_state": {...}, "optimizer_state": ...,
    "step": ...}`) is read under `key`, else under the first of `NESTED_KEYS` whose value
    is a mapping of tensors.

    Raises:
        InvalidInputs: the file is unreadable, holds a pickle payload, is not a mapping
            of names to tensors (details `not_tensors`, and `candidates`: the keys that do
            hold one), or lacks `key` (details `reason` `key_not_found`, `candidates`).
    """
    fmt = detect_format(path)
    obj = _read(path, fmt)
    assert fmt is not None  # _read refuses the others
    chosen: str | None = None
    if key is not None:
        if not isinstance(obj, Mapping) or not isinstance(obj.get(key), Mapping):
            candidates = _candidates(obj)
            raise InvalidInputs(
                f"The weights file has no state dict under the key {key!r} of option weights.key.",
                hint=_key_hint(candidates),
                stage=STAGE,
                details={
                    "source": "weights",
                    "format": fmt,
                    "reason": "key_not_found",
                    "key": key,
                    "candidates": candidates,
                },
            )
        obj, chosen = obj[key], key
    elif isinstance(obj, Mapping) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        chosen = next((k for k in NESTED_KEYS if _is_state_dict(obj.get(k))), None)
        if chosen is not None:
            obj = obj[chosen]
    if not isinstance(obj, Mapping):
        raise InvalidInputs(
            "The weights file does not hold a state dict.",
            stage=STAGE,
            details={"source": "weights", "format": fmt, "got": type(obj).__name__},
        )
    bad = sorted(str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor))
    if bad:
        candidates = _candidates(obj) if chosen is None else []
        raise InvalidInputs(
            "Some entries of the weights file are not tensors.",
            hint=_key_hint(candidates),
            stage=STAGE,
            details={
                "source": "weights",
                "format": fmt,
                "not_tensors": bad[:50],
                "candidates": candidates,
                **({"key": chosen} if chosen is not None else {}),
            },
        )
    return StateDict({str(k): v for k, v in obj.items()}, fmt, chosen)


def _read(path: Path, fmt: str | None) -> Any:
    try:
        if fmt == "safetensors":
            return safetensors.torch.load_file(str(path), device="cpu")
        if fmt == "pt":
            # weights_only=True passed explicitly: no environment variable can turn it off.
            return torch.load(str(path), map_location="cpu", weights_only=True)
        raise InvalidInputs(
            "The weights file is not .safetensors, .pt or .pth.",
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


def _is_state_dict(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, torch.Tensor) for v in value.values())
    )


def _candidates(obj: Any) -> list[str]:
    """The top-level keys of `obj` whose values are state dicts, at most 20."""
    if not isinstance(obj, Mapping):
        return []
    return sorted(str(k) for k, v in obj.items() if _is_state_dict(v))[:20]


def _key_hint(candidates: list[str]) -> str:
    if candidates:
        named = ", ".join(f'"{c}"' for c in candidates)
        return (
            f"The file holds a state dict under {named}: set option weights.key to the one "
            f'to load, e.g. {{"weights": {{"key": "{candidates[0]}"}}}}.'
        )
    return "Save `model.state_dict()` only, preferably with safetensors."


def load_weights(
    module: torch.nn.Module, path: Path, options: WeightsOptions | None = None
) -> tuple[WeightsReport, list[ReportWarning]]:
    """Load the state dict at `path` into `module`, as option `weights` asks.

    Returns:
        `report.weights`, and warning `weights_skipped` when a non-strict load left
        names of the model or of the file out.

    Raises:
        InvalidInputs: the file cannot be read as a state dict.
        WeightsMismatch: shapes differ, or (strict) keys are missing or unexpected, or
            (not strict) no name matches; details hold `missing`, `unexpected` and
            `shape_mismatch` (`key`, `expected`, `got`), `prefix` where dropping it from
            the file's names would make them match, `matched` when none did.
    """
    options = options or WeightsOptions()
    state = read_state_dict(path, options.key)
    tensors = state.tensors
    expected = module.state_dict()
    shape_mismatch = [
        {"key": key, "expected": list(expected[key].shape), "got": list(tensor.shape)}
        for key, tensor in tensors.items()
        if key in expected and expected[key].shape != tensor.shape
    ]
    if shape_mismatch:
        # load_state_dict stops at the first size mismatch; report the key diff alongside.
        raise _mismatch(
            missing=sorted(set(expected) - set(tensors)),
            unexpected=sorted(set(tensors) - set(expected)),
            shape_mismatch=shape_mismatch,
        )
    try:
        # strict=False so the result lists keys after the module's own load hooks ran;
        # with option strict any difference is then refused as strict=True would.
        result = module.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:
        raise _mismatch(
            missing=sorted(set(expected) - set(tensors)),
            unexpected=sorted(set(tensors) - set(expected)),
            shape_mismatch=[],
            exception=type(exc).__name__,
        ) from exc
    missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    if options.strict and (missing or unexpected):
        raise _mismatch(missing=missing, unexpected=unexpected, shape_mismatch=[])
    loaded = len(tensors) - len(unexpected)
    if loaded == 0:
        raise _mismatch(missing=missing, unexpected=unexpected, shape_mismatch=[], matched=0)
    report = WeightsReport(
        file=path.name,
        format="safetensors" if state.format == "safetensors" else "pt",
        key=state.key,
        strict=options.strict,
        tensors=len(tensors),
        loaded=loaded,
        missing=missing[:WEIGHTS_MAX_LISTED],
        missing_count=len(missing),
        unexpected=unexpected[:WEIGHTS_MAX_LISTED],
        unexpected_count=len(unexpected),
    )
    if not missing and not unexpected:
        return report, []
    skipped = ReportWarning(
        code="weights_skipped",
        message=f"Not every name of the weights matched the model (option weights.strict is "
        f"false): {len(missing)} of the model's parameters and buffers kept their "
        f"initial values, {len(unexpected)} tensors of the file were not loaded.",
        details={
            "missing": missing[:WARNING_LISTED],
            "missing_count": len(missing),
            "unexpected": unexpected[:WARNING_LISTED],
            "unexpected_count": len(unexpected),
        },
    )
    return report, [skipped]


def _prefix(missing: list[str], unexpected: list[str]) -> str | None:
    """The first name part all of the file's unexpected names share and the model's
    names lack (`module.` of DataParallel, `model.` of a Lightning module), when dropping
    it names every missing key."""
    heads = {name.split(".", 1)[0] for name in unexpected}
    if not missing or len(heads) != 1 or not all("." in name for name in unexpected):
        return None
    prefix = heads.pop() + "."
    return prefix if set(missing) <= {name[len(prefix) :] for name in unexpected} else None


def _mismatch(
    *,
    missing: list[str],
    unexpected: list[str],
    shape_mismatch: list[dict[str, Any]],
    exception: str | None = None,
    matched: int | None = None,
) -> WeightsMismatch:
    details: dict[str, Any] = {
        "missing": missing,
        "unexpected": unexpected,
        "shape_mismatch": shape_mismatch,
    }
    if exception is not None:
        details["exception"] = exception
    if matched is not None:
        details["matched"] = matched
    hint = None
    prefix = _prefix(missing, unexpected)
    if prefix is not None:
        details["prefix"] = prefix
        hint = (
            f"The file's names start with {prefix!r}, the model's do not (a model saved "
            "inside a wrapper, such as DataParallel or a Lightning module): save the inner "
            f"model's state_dict(), or remove {prefix!r} from the names."
        )
    elif not shape_mismatch and matched is None:
        hint = (
            "Upload the state dict saved from this exact model class, or set option "
            "weights.strict to false to load the names that match (report.weights lists "
            "the others)."
        )
    parts = [
        f"{len(missing)} missing" if missing else "",
        f"{len(unexpected)} unexpected" if unexpected else "",
        f"{len(shape_mismatch)} of another shape" if shape_mismatch else "",
    ]
    summary = ", ".join(p for p in parts if p) or "a mismatch"
    if matched == 0:
        summary = f"no name matches ({summary})"
    return WeightsMismatch(
        f"The uploaded weights do not match the model: {summary}.",
        hint=hint,
        stage=STAGE,
        details=details,
    )
