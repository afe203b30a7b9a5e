"""`int8_weight_only`, `int4_weight_only` and `8da4w` (and AOTInductor's `int8_dynamic`:
8-bit dynamic activations, per-channel int8 weights) through torchao's `quantize_` on the
model's linears (embeddings stay float: ExecuTorch's XNNPACK lowering has no kernel for
torchao's `dequantize_affine` outside a linear), with the configs ExecuTorch's
`export_llm` uses for XNNPACK (`executorch.extension.llm.export.quantize`), then exported
again with the job's dynamic shapes."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.load import module_copies, pages
from engine.verify.precision import reduced, widened

__all__ = ["quantize"]


def quantize(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    scheme: str,
    group_size: int,
    dynamic_shapes: Any = None,
    strict: bool = False,
    float32: bool = False,
) -> torch.export.ExportedProgram:
    """A copy of `module` with its linears quantized by `scheme`, exported.

    Linears whose input features are not a multiple of `group_size` stay float for the
    grouped schemes (`int4_weight_only`, `8da4w`), as `export_llm` skips them. The copy
    shares `module`'s float weights (`module_copies.sharing_weights`): `quantize_` gives
    each quantized linear a new weight of its own, one layer at a time, and leaves the
    shared tensors as they are, so no float copy of the model is ever made.

    With `float32` (a bfloat16 or float16 model for ExecuTorch, whose XNNPACK kernels for
    these schemes take float32 activations: `export_llm` converts the model first), the
    copy computes in float32: its other weights and its buffers are widened up front,
    each linear's weight just before torchao quantizes it, one layer at a time, and an
    embedding's rows as it gives them (its table stays in its dtype: gathered, then
    widened).

    A float weight torchao has quantized (or that was widened for it) is not read again
    by the copy: when it lies in the checkpoint's mapping, its pages are given back
    (`engine.load.pages`) before the next layer's are read, so the model's float weights
    are not all resident at once beside their quantized copies.
    """
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import (
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        quantize_,
    )

    model = module_copies.sharing_weights(module)
    int4: torch.dtype = getattr(torch, "int4")  # noqa: B009 (torch's stubs lack it)
    grouped = scheme in ("int4_weight_only", "8da4w")
    config: Any
    if scheme == "int8_dynamic":  # AOTInductor's: 8-bit dynamic activations, int8 weights
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int8, weight_granularity=PerAxis(0)
        )
    elif scheme == "int8_weight_only":
        config = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
    elif scheme == "int4_weight_only":
        config = IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup(group_size))
    elif scheme == "8da4w":
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=int4, weight_granularity=PerGroup(group_size)
        )
    else:
        raise ValueError(f"not a torchao linear scheme: {scheme}")

    done: list[torch.Tensor] = []  # float weights already quantized (or widened)

    def give_back() -> None:
        for weight in done:
            pages.release(weight)
        done.clear()

    def linear(layer: torch.nn.Module, _fqn: str) -> bool:
        give_back()  # the last layer is quantized by now
        if not isinstance(layer, torch.nn.Linear):
            return False
        done.append(layer.weight)
        if float32:
            _widen(layer)  # just before its quantization: one float32 weight at a time
        return not grouped or layer.in_features % group_size == 0

    if float32:
        for layer in model.modules():
            if isinstance(layer, torch.nn.Embedding):
                layer.register_forward_hook(_widened_output)
            elif not isinstance(layer, torch.nn.Linear):
                _widen(layer)
        args, kwargs = pytree.tree_map(widened, (tuple(args), dict(kwargs)))

    quantize_(model, config, filter_fn=linear)
    give_back()
    # torchao's quantized weights are tensor subclasses; as ExecuTorch's own export stages
    # do, they become parametrizations over plain tensors before export, or decomposing a
    # program that also mutates buffers (a static KV cache) fails in AOTAutograd.
    from torchao.utils import unwrap_tensor_subclass

    unwrap_tensor_subclass(model)
    return torch.export.export(
        model, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes, strict=strict
    )


def _widened_output(_layer: torch.nn.Module, _inputs: Any, output: Any) -> Any:
    """An embedding's rows in float32: the table stays in its dtype (a bfloat16 128256 x
    3072 table is 0.8 GB, 1.6 GB widened) and the rows it gives are widened, the same
    values as a widened table's."""
    return pytree.tree_map(widened, output)


def _widen(layer: torch.nn.Module) -> None:
    """`layer`'s own bfloat16/float16 parameters and buffers replaced by float32 ones of
    its own (the tensors it shared stay as they are)."""
    for name, parameter in list(layer._parameters.items()):
        if reduced(parameter):
            assert parameter is not None
            layer._parameters[name] = torch.nn.Parameter(
                parameter.detach().float(), requires_grad=False
            )
    for name, buffer in list(layer._buffers.items()):
        if reduced(buffer):
            assert buffer is not None
            layer._buffers[name] = buffer.float()
