"""Ops ONNX runs as single nodes, which the `onnx` target keeps whole (docs/targets.md,
*ONNX: native ops*): which ops they are, which a program calls, and the exceptions
(an LSTM with a projection, which torch_lib would translate into a broken node; an empty
batch, on which ONNX Runtime aborts its recurrent nodes)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "EMPTY_REFUSED",
    "NATIVE_OPS",
    "RECURRENT_NODES",
    "native_ops",
    "projected",
    "without_mistranslated",
]

NATIVE_OPS = frozenset(
    {
        torch.ops.aten.lstm.input,
        torch.ops.aten.gru.input,
        torch.ops.aten.rnn_tanh.input,
        torch.ops.aten.rnn_relu.input,
        torch.ops.aten.scaled_dot_product_attention.default,
    }
)
"""Ops the core ATen decomposition unrolls or spells out that ONNX has single nodes for:
`LSTM`, `GRU`, `RNN` (`engine.targets.onnx.rnn`) and, from opset 23, `Attention`."""


RECURRENT_NODES = frozenset({"LSTM", "GRU", "RNN"})
"""ONNX's recurrent ops: ONNX Runtime aborts the process on an empty input to them."""

EMPTY_REFUSED = (
    "not run: ONNX Runtime aborts the whole process on an empty input to its LSTM, GRU "
    "and RNN nodes; declare 1 as the min of the dims that can be 0 here"
)


def native_ops(program: torch.export.ExportedProgram) -> list[str]:
    """The `NATIVE_OPS` called in `program` (its subgraphs included), by name."""
    return sorted(
        {
            str(node.target)
            for module in program.graph_module.modules()
            if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes
            if node.op == "call_function" and node.target in NATIVE_OPS
        }
    )


def without_mistranslated(
    program: torch.export.ExportedProgram,
) -> torch.export.ExportedProgram:
    """`program` with the ops torch_lib would translate into a broken model decomposed
    first: an LSTM with `proj_size` (ONNX `LSTM` has no projection; torch_lib's node
    for it makes a model ONNX Runtime refuses to load), unrolled as `core_aten` does."""
    lstm = torch.ops.aten.lstm.input
    nodes = [
        node
        for module in program.graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.op == "call_function" and node.target is lstm
    ]
    if not any(projected(node) for node in nodes):
        return program
    return program.run_decompositions({lstm: torch.export.default_decompositions()[lstm]})


def projected(node: torch.fx.Node) -> bool:
    """Whether an `aten.lstm.input` node has a projection: 5 weights per layer and
    direction with biases (3 without) where a plain LSTM has 4 (2)."""
    _, _, params, has_biases, num_layers, _, _, bidirectional, *_ = node.args
    assert isinstance(params, Sequence) and isinstance(num_layers, int)
    plain = (4 if has_biases else 2) * num_layers * (2 if bidirectional else 1)
    return len(params) != plain
