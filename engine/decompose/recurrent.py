"""Recurrent layers stay whole in `core_aten` mode unless `decomposition.unroll_recurrent`.

torch's core ATen table decomposes `aten.lstm.input` (and GRU, RNN) by unrolling the
layer over its time steps: ~20 ATen nodes per frame and layer, so a 3-layer LSTM over 160
frames becomes ~10,000 nodes and the decomposing stage takes minutes
(`bench/onnx_native_ops.py`). Kept whole, the op runs in torch as it does eagerly, stays
one native node in ONNX (`engine.targets.onnx`), and ExecuTorch and AOTInductor
decompose it themselves. The program then holds an op outside the core ATen set, which
the warning `recurrent_ops_kept` says.
"""

from __future__ import annotations

from typing import Any

import torch

from schemas import ReportWarning

__all__ = ["OPS", "kept_warnings"]

OPS: list[Any] = [
    torch.ops.aten.lstm.input,
    torch.ops.aten.lstm.data,
    torch.ops.aten.gru.input,
    torch.ops.aten.gru.data,
    torch.ops.aten.rnn_tanh.input,
    torch.ops.aten.rnn_tanh.data,
    torch.ops.aten.rnn_relu.input,
    torch.ops.aten.rnn_relu.data,
]
"""The recurrent ops (padded and packed-sequence forms) kept whole by default."""

_NAMES = frozenset(str(op) for op in OPS)


def kept_warnings(ops_after: dict[str, int]) -> list[ReportWarning]:
    """The `recurrent_ops_kept` warning when the decomposed program calls recurrent ops."""
    kept = {name: count for name, count in sorted(ops_after.items()) if name in _NAMES}
    if not kept:
        return []
    names = list(kept)
    return [
        ReportWarning(
            code="recurrent_ops_kept",
            message=(
                "Recurrent layers were kept as single ops instead of being unrolled over "
                "their time steps: " + ", ".join(names) + ". They run in torch as they do "
                "eagerly and stay native nodes in ONNX, but the program is not core ATen "
                "only: set decomposition.unroll_recurrent to true for that (decomposing "
                "then takes minutes for long sequences)."
            ),
            details={"ops": names, "counts": kept},
        )
    ]
