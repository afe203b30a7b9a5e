"""`int8` and `int8_dynamic` through PT2E: torchao's `prepare_pt2e` / `convert_pt2e` with
ExecuTorch's XNNPACK quantizer (per-channel symmetric int8 weights; int8 activations,
per-tensor, calibrated on the given inputs for `int8`, computed at run time for
`int8_dynamic`), as ExecuTorch's own XNNPACK examples quantize."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["quantize"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def quantize(
    traced: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    dynamic: bool,
    calibration: Sequence[Inputs],
    dynamic_shapes: Any = None,
) -> torch.export.ExportedProgram:
    """The program `traced` quantized, exported again (with the same dynamic shapes).

    Args:
        traced: the program before `run_decompositions`.
        args, kwargs: its example inputs.
        dynamic: `int8_dynamic` (no calibration) rather than static `int8`.
        calibration: the inputs the observers see (the first alone for `int8_dynamic`).
        dynamic_shapes: the torch spec `traced` was exported with.
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    )
    prepared = prepare_pt2e(traced.module(), quantizer)
    # Dynamic activations need no calibration, but the weights' observers must still see
    # one run (else their qparams are defaults): the example is enough.
    with torch.no_grad():
        for sample_args, sample_kwargs in calibration[:1] if dynamic else calibration:
            prepared(*copy.deepcopy(sample_args), **copy.deepcopy(sample_kwargs))
    converted = convert_pt2e(prepared)
    return torch.export.export(
        converted, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes, strict=False
    )
