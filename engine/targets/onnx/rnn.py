"""`nn.RNN` as ONNX `RNN` nodes: translations the ONNX exporter lacks.

onnxscript's torch_lib translates `aten.lstm.input` and `aten.gru.input` to ONNX `LSTM`
and `GRU`, one node per layer, but has nothing for `aten.rnn_tanh.input` and
`aten.rnn_relu.input`, so the exporter decomposes them and unrolls every time step
(~20 nodes per frame and layer). `TRANSLATIONS` (for `torch.onnx.export`'s
`custom_translation_table`) writes one ONNX `RNN` node per layer instead, as torch_lib's
`aten_gru` does for GRU: ONNX `RNN` computes `H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`,
PyTorch's equation with its weights in the same layout (no gates to reorder).

Imported only by `engine.targets.onnx.convert`: onnxscript is an optional package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from onnxscript import opset18
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

__all__ = ["TRANSLATIONS"]

op: Any = opset18
"""The opset's typed signatures take ONNX tensors only; traced, as here, the exporter
also takes Python ints, lists and bools and makes them constants, as torch_lib does."""


def _rnn(
    activation: str,
    input: Any,
    hx: Any,
    params: Sequence[Any],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Any, Any]:
    """The layers of `aten.rnn_<activation>.input` as ONNX `RNN` nodes."""
    directions = 2 if bidirectional else 1
    if batch_first:  # ONNX RNN takes [seq, batch, features]
        input = op.Transpose(input, perm=[1, 0, 2])
    per_direction = 4 if has_biases else 2  # w_ih, w_hh[, b_ih, b_hh]
    hidden_size = hx.shape[2]
    current = input
    finals = []
    for layer in range(num_layers):
        initial = op.Slice(hx, [layer * directions], [(layer + 1) * directions], axes=[0])
        w, r, b = [], [], []
        for direction in range(directions):
            first = (layer * directions + direction) * per_direction
            w.append(op.Unsqueeze(params[first], [0]))
            r.append(op.Unsqueeze(params[first + 1], [0]))
            if has_biases:  # ONNX takes [Wb, Rb] concatenated
                b.append(op.Unsqueeze(op.Concat(params[first + 2], params[first + 3], axis=0), [0]))
        y, y_h = op.RNN(
            current,
            op.Concat(*w, axis=0) if directions > 1 else w[0],
            op.Concat(*r, axis=0) if directions > 1 else r[0],
            (op.Concat(*b, axis=0) if directions > 1 else b[0]) if has_biases else None,
            None,  # sequence_lens: every sequence is full length
            initial,
            activations=[activation] * directions,
            direction="bidirectional" if bidirectional else "forward",
            hidden_size=hidden_size,
        )
        # Y is [seq, directions, batch, hidden]; the next layer and the output take
        # [seq, batch, directions * hidden], both directions' features side by side
        current = op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))
        if layer < num_layers - 1 and dropout > 0.0 and train:
            current, _ = op.Dropout(current, dropout, train)
        finals.append(y_h)
    final = op.Concat(*finals, axis=0) if len(finals) > 1 else finals[0]
    if batch_first:
        current = op.Transpose(current, perm=[1, 0, 2])
    return current, final


# The annotations are the ONNX signature the exporter infers and matches the node with.
def rnn_tanh(
    input: TFloat,
    hx: TFloat,
    params: Sequence[TFloat],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[TFloat, TFloat]:
    """`aten.rnn_tanh.input` (nn.RNN, nonlinearity "tanh") → ONNX `RNN`, one per layer."""
    return _rnn(
        "Tanh", input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
        batch_first,
    )  # fmt: skip


def rnn_relu(
    input: TFloat,
    hx: TFloat,
    params: Sequence[TFloat],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[TFloat, TFloat]:
    """`aten.rnn_relu.input` (nn.RNN, nonlinearity "relu") → ONNX `RNN`, one per layer."""
    return _rnn(
        "Relu", input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
        batch_first,
    )  # fmt: skip


TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.ops.aten.rnn_tanh.input: rnn_tanh,
    torch.ops.aten.rnn_relu.input: rnn_relu,
}
"""`custom_translation_table` entries for `torch.onnx.export(..., dynamo=True)`."""
