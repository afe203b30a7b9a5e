"""The weights of an ONNX model before it is written: a MatMul by a weight's transpose
made a MatMul by the transposed weight, for ONNX Runtime's 4-bit quantizer
(`engine.quantization.onnx_runtime`), which quantizes MatMuls by an initializer only."""

from __future__ import annotations

from typing import Any

from engine.quantization.onnx_embedding import TRANSPOSED

__all__ = ["transposed"]


def transposed(model: Any) -> int:
    """Each `MatMul(A, Transpose(W))` of `model` (an `onnx_ir.Model`'s main graph), W a
    2-D initializer, as `MatMul(A, W')`: W' is a new initializer, transposed lazily as
    `onnx_ir.save` writes it (a tied LM head's 128256 x 2048 weight, which the
    exporter's constant folding leaves above its size limit, is never held twice). W
    stays for its other users (a tied embedding's Gather). Returns how many MatMuls
    take a transposed weight."""
    import onnx_ir as ir

    count = 0
    for node in list(model.graph):
        given = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) > 1 else None
        producer = given.producer() if given is not None else None
        if producer is None or producer.op_type != "Transpose":
            continue
        source = producer.inputs[0]
        perm = producer.attributes.get("perm")
        tensor = source.const_value if source is not None else None
        if tensor is None or len(tensor.shape) != 2:
            continue
        if perm is not None and list(perm.value) != [1, 0]:
            continue
        rows, columns = tensor.shape
        name = f"{source.name}{TRANSPOSED}"  # how the quantizer finds its tied table
        value = ir.Value(
            name=name,
            shape=ir.Shape([columns, rows]),
            type=ir.TensorType(tensor.dtype),
            const_value=ir.LazyTensor(
                _transposing(tensor),
                dtype=tensor.dtype,
                shape=ir.Shape([columns, rows]),
                name=name,
            ),
        )
        model.graph.register_initializer(value)
        node.replace_input_with(1, value)
        if not producer.outputs[0].uses():
            model.graph.remove(producer, safe=True)
        count += 1
    return count


def _transposing(tensor: Any) -> Any:
    """What makes `tensor` transposed when `onnx_ir.save` asks for it."""
    import numpy as np
    import onnx_ir as ir

    return lambda: ir.tensor(np.ascontiguousarray(tensor.numpy().T))
