"""The module's own example inputs and the eager reference run (LOAD stage, steps 4 and 6).

`module_inputs` reads `example_args` / `example_kwargs` from the entry module when no
inputs file was uploaded; `run_eager` runs a deep copy of the model once, leaving the
model and its inputs untouched, for the reference outputs and buffers. The copy shares
the model's weights (`engine.load.module_copies`): a forward that writes its own parameters
fails the run instead of being copied for.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from engine.diagnostics.source_map import SourceMap
from engine.errors import EagerRunFailed, InvalidInputs
from engine.load import module_copies, training_mode
from engine.load.inputs import normalize_inputs
from engine.load.weights import load_weights
from schemas import ExportOptions, ReportWarning, WeightsReport

__all__ = ["Prepared", "module_inputs", "prepare", "run_eager"]

STAGE = "loading"

_MISSING = object()


def module_inputs(
    module: ModuleType, model: torch.nn.Module
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The entry module's `example_args` and `example_kwargs`, normalized."""
    args = getattr(module, "example_args", _MISSING)
    if args is _MISSING:
        if _required_parameters(model):
            raise InvalidInputs(
                "No example inputs: the module has no `example_args` and no inputs file "
                "was uploaded.",
                hint="Define `example_args` in the module or upload an inputs file.",
                stage=STAGE,
                details={"source": "module", "missing": "example_args"},
            )
        args = ()
    return normalize_inputs(args, getattr(module, "example_kwargs", None), source="module")


def _required_parameters(model: torch.nn.Module) -> list[str]:
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return ["?"]
    return [
        p.name
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def run_eager(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    source_map: SourceMap,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """Run a copy of `module` (sharing its weights) once on deep copies of the inputs,
    under no_grad.

    `module` and the inputs are left untouched, buffers included. A module that
    cannot be deep-copied is run itself, and its parameters and buffers are restored
    afterwards.

    Returns:
        The outputs, and the reference copy's buffers after the run.

    Raises:
        EagerRunFailed: the forward raised (location: the innermost user frame;
            details `exception`), or wrote the model's parameters in place (details
            `reason` `weights_changed`, `parameters`).
    """
    weights = module_copies.WeightVersions(module)
    try:
        reference = module_copies.sharing_weights(module)
        saved = None
    except Exception:
        reference = module
        saved = _snapshot(module)
    try:
        run_args, run_kwargs = copy.deepcopy((args, kwargs))
    except Exception:
        # e.g. non-leaf tensors, which refuse deepcopy
        run_args, run_kwargs = tree_map_only(
            torch.Tensor, lambda t: t.detach().clone(), (args, kwargs)
        )
    try:
        with torch.no_grad():
            outputs = reference(*run_args, **run_kwargs)
        buffers = {name: b for name, b in reference.named_buffers()}
        if saved is not None:
            buffers = {name: b.clone() for name, b in buffers.items()}
    except Exception as exc:
        raise EagerRunFailed(
            f"Running the model on its example inputs failed: {type(exc).__name__}: "
            f"{source_map.scrub(str(exc))}",
            stage=STAGE,
            location=source_map.from_exception(exc),
            details={"exception": type(exc).__name__},
        ) from exc
    finally:
        if saved is not None:
            _restore(module, saved)
    changed = weights.changed() if saved is None else []
    if changed:
        raise EagerRunFailed(
            "Running the model changed its own parameters in place: " + ", ".join(changed[:5]),
            hint="Keep the forward from writing parameters (use buffers for state): the "
            "export and its verification run the model as uploaded, sharing its weights.",
            stage=STAGE,
            details={"reason": "weights_changed", "parameters": changed[:20]},
        )
    return outputs, buffers


_Snapshot = list[tuple[torch.nn.Module, str, str, torch.Tensor | None, torch.Tensor | None]]


def _snapshot(module: torch.nn.Module) -> _Snapshot:
    """The tensor objects of every parameter and buffer, with a copy of their values."""
    saved: _Snapshot = []
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(owner, kind).items():
                value = None if tensor is None else tensor.detach().clone()
                saved.append((owner, kind, name, tensor, value))
    return saved


def _restore(module: torch.nn.Module, saved: _Snapshot) -> None:
    with torch.no_grad():
        for owner, kind, name, tensor, value in saved:
            getattr(owner, kind)[name] = tensor
            if tensor is not None and value is not None:
                tensor.copy_(value)


@dataclass
class Prepared:
    """What `prepare` hands the loaded model: its inputs on the device, the eager
    reference (when run), how the weights were loaded, and the warnings of both steps."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: Any = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: WeightsReport | None = None
    warnings: list[ReportWarning] = field(default_factory=list)


def prepare(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    weights: Path | None,
    options: ExportOptions,
    source_map: SourceMap,
    reference: bool,
) -> Prepared:
    """The last steps of loading, for code and checkpoint uploads alike: the uploaded
    weights loaded (option `weights`), the model put in the mode option `training` asks
    for (`engine.load.training_mode`), model and inputs moved to `options.device`, and with
    `reference` the eager reference run, which so runs the model as it is exported.

    Returns:
        The inputs on the device, the reference outputs and buffers (None and {}
        without `reference`), `report.weights` and the warnings.
    """
    prepared = Prepared(args, kwargs)
    if weights is not None:
        prepared.weights, prepared.warnings = load_weights(model, weights, options.weights)
    made_eval = training_mode.apply(model, options.training)
    if made_eval is not None:
        prepared.warnings.append(made_eval)
    if options.device == "cuda":
        model.to("cuda")
        prepared.args, prepared.kwargs = tree_map_only(
            torch.Tensor, lambda t: t.to("cuda"), (args, kwargs)
        )
    if reference:
        prepared.outputs, prepared.buffers = run_eager(
            model, prepared.args, prepared.kwargs, source_map
        )
    return prepared
