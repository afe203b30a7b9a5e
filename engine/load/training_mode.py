"""A model left in training mode (LOAD stage): exported as its eval model, as
`torch.onnx.export` (`training=TrainingMode.EVAL`) and optimum export, unless option
`training` says otherwise.

A module built without `.eval()` is in training mode: BatchNorm then normalizes with the
batch's own statistics (a batch of one frame answers something else entirely), Dropout
drops activations at random. Exporting that is rarely what anyone deploys, and verifying
it against the training-mode eager model proves nothing; so the model is put in eval mode
before the eager reference is run, and warning `model_in_training_mode` names the layers
whose behaviour that changed. Option `training`: `"eval"` (that), `"preserve"` (export the
modes as they are, with the same warning) or `"refuse"` (`invalid_request`).
"""

from __future__ import annotations

import inspect
import re
import weakref
from typing import Any

from torch import nn

from engine.errors import InvalidRequest
from engine.load.model_resolution import FunctionModule
from schemas import ReportWarning, TrainingOption

__all__ = ["MAX_LISTED", "apply", "training_layers"]

STAGE = "loading"
MAX_LISTED = 20
"""Modules named in the warning's (or the refusal's) `details.modules`; `count` has all."""

_READS_TRAINING = re.compile(r"\bself\.training\b")


def training_layers(model: nn.Module) -> list[dict[str, str]]:
    """The modules of `model` in training mode whose forward depends on the mode, in
    `named_modules` order: `{path, type, kind}`, kind one of `batch_norm`,
    `instance_norm`, `dropout`, `rrelu`, `reads_training` (a class of the upload or a
    library whose code reads `self.training`)."""
    found = []
    for path, module in model.named_modules(remove_duplicate=True):
        kind = _kind(module) if module.training else None
        if kind is not None:
            found.append({"path": path, "type": type(module).__name__, "kind": kind})
    return found


def apply(model: nn.Module, option: TrainingOption) -> ReportWarning | None:
    """Put `model` in the mode option `training` asks for before anything runs it.

    Returns:
        Warning `model_in_training_mode` when layers whose behaviour depends on the mode
        were in training mode (`details.exported_in`: `eval`, or `training` with
        `preserve`); None otherwise.

    Raises:
        InvalidRequest: with `refuse`, such layers were in training mode (details
            `reason` `training_mode`, `modules`, `count`); the model is left as it was.
    """
    layers = training_layers(model)
    if option == "refuse" and layers:
        raise InvalidRequest(
            f"The model is in training mode: {_described(layers)} behave differently in "
            "eval mode, and option training is refuse.",
            hint="Call .eval() on the model in your module (model = Net().eval()), or set "
            'option training to "eval" (export as in eval mode) or "preserve" (export the '
            "training-mode behaviour).",
            stage=STAGE,
            details={"reason": "training_mode", **_listed(layers)},
        )
    if option != "preserve":
        model.eval()
    if not layers:
        return None
    if option == "preserve":
        message = (
            f"The model is exported in training mode, as option training asks: "
            f"{_described(layers)} keep their training behaviour (batch statistics, random "
            "dropout) in every artifact."
        )
    else:
        message = (
            f"The model was in training mode (no .eval()): {_described(layers)} behave "
            "differently there; it was exported and verified in eval mode. Set option "
            'training to "preserve" to export the training-mode behaviour instead.'
        )
    exported_in = "training" if option == "preserve" else "eval"
    return ReportWarning(
        code="model_in_training_mode",
        message=message,
        details={"exported_in": exported_in, **_listed(layers)},
    )


def _listed(layers: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "modules": layers[:MAX_LISTED],
        "count": len(layers),
        "kinds": sorted({layer["kind"] for layer in layers}),
    }


def _described(layers: list[dict[str, str]]) -> str:
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer["type"]] = counts.get(layer["type"], 0) + 1
    return ", ".join(f"{n} {name}" for name, n in counts.items())


def _kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        # without running statistics it normalizes by the batch in eval mode too
        return "batch_norm" if module.running_mean is not None else None
    if isinstance(module, nn.modules.instancenorm._InstanceNorm):
        return "instance_norm" if module.running_mean is not None else None
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return "dropout" if module.p > 0 else None
    if isinstance(module, nn.RNNBase):
        return "dropout" if module.dropout > 0 and module.num_layers > 1 else None
    if isinstance(module, nn.MultiheadAttention):
        return "dropout" if module.dropout > 0 else None
    if isinstance(module, nn.RReLU):
        return "rrelu"
    if isinstance(module, FunctionModule):
        return None
    return "reads_training" if _reads_training(type(module)) else None


_reads_cache: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
"""`_reads_training` per class, dropped with the class (an upload's, once its job is done)."""


def _reads_training(cls: type) -> bool:
    """Whether a class outside torch (the upload's, or a library's) has code reading
    `self.training`, in itself or in a base class."""
    known = _reads_cache.get(cls)
    if known is None:
        known = _reads_cache[cls] = any(_source_reads_training(k) for k in cls.__mro__)
    return known


def _source_reads_training(klass: type) -> bool:
    if (klass.__module__ or "").split(".")[0] in ("torch", "builtins"):
        return False
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):
        return False
    return _READS_TRAINING.search(source) is not None
