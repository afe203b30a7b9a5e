"""`int8` and `int8_dynamic` through PT2E: torchao's `prepare_pt2e` / `convert_pt2e` with
ExecuTorch's XNNPACK quantizer (per-channel symmetric int8 weights; int8 activations,
per-tensor, calibrated on the given inputs for `int8`, computed at run time for
`int8_dynamic`), as ExecuTorch's own XNNPACK examples quantize."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["DYNAMIC", "LEFT_FLOAT", "quantize"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


LEFT_FLOAT = "add, mul and cat left float"
"""What the first fallback of static `int8` keeps float: with per-tensor activations the
residual adds of a transformer (their outliers) cost most of its accuracy."""

DYNAMIC = "activations quantized at run time"
"""The second fallback: `int8_dynamic`'s linears (int8 weights, per-token activations)."""


def quantize(
    traced: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    dynamic: bool,
    calibration: Sequence[Inputs],
    dynamic_shapes: Any = None,
    accept: Callable[[torch.fx.GraphModule], bool] | None = None,
    fallbacks: list[str] | None = None,
) -> torch.export.ExportedProgram:
    """The program `traced` quantized, exported again (with the same dynamic shapes).

    Args:
        traced: the program before `run_decompositions`.
        args, kwargs: its example inputs.
        dynamic: `int8_dynamic` (no calibration) rather than static `int8`.
        calibration: the inputs the observers see (the first alone for `int8_dynamic`).
        dynamic_shapes: the torch spec `traced` was exported with.
        accept: for static `int8`, whether a converted module is accurate enough; when it
            is not, the quantization is made again with adds, muls and concatenations
            left float (`LEFT_FLOAT`), then, if that is not either, with the linears'
            activations quantized at run time (`DYNAMIC`); what was used is appended to
            `fallbacks`.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    skipped = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.cat.default)
    attempts: list[tuple[bool, Callable[[torch.fx.Node], bool] | None, str | None]] = [
        (dynamic, None, None)
    ]
    if accept is not None and not dynamic:
        attempts.append((False, lambda node: node.target not in skipped, LEFT_FLOAT))
        attempts.append((True, None, DYNAMIC))
    for attempt, (run_time, keep, note) in enumerate(attempts):
        prepared = prepare_pt2e(traced.module(), _quantizer(run_time, keep))
        # Dynamic activations need no calibration, but the weights' observers must still
        # see one run (else their qparams are defaults): the example is enough.
        with torch.no_grad():
            for sample_args, sample_kwargs in calibration[:1] if run_time else calibration:
                prepared(*copy.deepcopy(sample_args), **copy.deepcopy(sample_kwargs))
        converted = convert_pt2e(prepared)
        last = attempt == len(attempts) - 1
        if last or accept is None or accept(converted):
            if note is not None and fallbacks is not None:
                fallbacks.append(note)
            break
    return torch.export.export(
        converted, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes, strict=False
    )


def _quantizer(dynamic: bool, keep: Callable[[torch.fx.Node], bool] | None) -> Any:
    """ExecuTorch's XNNPACK quantizer (per-channel symmetric weights), annotating only the
    nodes `keep` says (all when None)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    class FloatOnlyQuantizer(XNNPACKQuantizer):
        """ExecuTorch's XNNPACK quantizer, its scalar-to-tensor transform kept to floating
        adds and muls: upstream's turns the scalar of every `add`/`mul` into a float32
        tensor, so an integer index (transformers' masks: `arange(n) + offset`) becomes
        float and `aten.index` then fails ("tensors used as indices must be long")."""

        def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            return _scalars_to_attributes(model)

    quantizer = FloatOnlyQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    )
    if keep is not None:
        quantizer.set_filter_function(keep)
    return quantizer


def _scalars_to_attributes(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The scalar operands of floating `add`/`mul` nodes as float tensor attributes (so the
    quantizer can observe them), integer arithmetic left alone."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torchao.quantization.pt2e.utils import get_new_attr_name_with_prefix

    targets = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
    for node in list(model.graph.nodes):
        value = node.meta.get("val")
        if node.op != "call_function" or node.target not in targets:
            continue
        if not isinstance(value, FakeTensor) or not value.dtype.is_floating_point:
            continue
        operands = list(node.args)
        for index, operand in enumerate(operands):
            if isinstance(operand, torch.fx.Node) or not isinstance(operand, int | float):
                continue
            name = get_new_attr_name_with_prefix("_tensor_constant_")(model)
            constant = torch.tensor(float(operand))
            model.register_buffer(name, constant)
            with model.graph.inserting_before(node):
                attribute = model.graph.create_node("get_attr", name, (), {})
            attribute.meta["val"] = value.fake_mode.from_tensor(constant, static_shapes=True)
            operands[index] = attribute
        node.args = tuple(operands)
    model.recompile()
    return model
