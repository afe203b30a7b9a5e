"""A tied embedding reading its LM head's 4-bit table. After `MatMulNBitsQuantizer`, a
tied head is `MatMulNBits` by the embedding's transposed weight (`onnx.weights`), whose
blocks are the embedding's rows blocked along the hidden size; the embedding's `Gather`
on the float table becomes ONNX Runtime's `GatherBlockQuantized` on those same bytes, as
ONNX Runtime GenAI's builder writes a tied model's `-p int4` (its `make_embedding_lookup`),
and the float table leaves the model."""

from __future__ import annotations

from typing import Any

__all__ = ["TRANSPOSED", "share_tied_embeddings"]

TRANSPOSED = "_transposed"
"""The suffix `onnx.weights.transposed` names a transposed copy of a weight with, by which
a tied head's `MatMulNBits` is found from its embedding's table."""


def share_tied_embeddings(graph: Any, block_size: int) -> list[str]:
    """Each `Gather(W, ids)` of `graph` (an `onnx.GraphProto`, after 4-bit quantization)
    whose table W a symmetric 4-bit `MatMulNBits` also holds, transposed, as
    `GatherBlockQuantized` on the head's quantized blocks and scales; W is removed once
    nothing else reads it. Returns the tables now shared. A hidden size `block_size`
    does not divide (the head pads its rows) keeps its float Gather."""
    from onnx import TensorProto, helper

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    heads = {
        node.input[1]: node
        for node in graph.node
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft"
    }
    shared: list[str] = []
    rewritten = []
    for node in graph.node:
        head = _head(node, initializers, heads, block_size)
        if head is None:
            rewritten.append(node)
            continue
        table = initializers[node.input[0]]
        rows, width = table.dims
        blocks = f"{node.name or node.output[0]}_shared_blocks"
        shape = helper.make_tensor(f"{blocks}_shape", TensorProto.INT64, [2], [rows, width // 2])
        graph.initializer.append(shape)
        rewritten.append(
            helper.make_node("Reshape", [head.input[1], shape.name], [blocks], name=blocks)
        )
        rewritten.append(
            helper.make_node(
                "GatherBlockQuantized",
                [blocks, node.input[1], head.input[2]],
                list(node.output),
                name=f"{node.name or node.output[0]}_quantized",
                domain="com.microsoft",
                bits=4,
                block_size=block_size,
                gather_axis=0,
                quantize_axis=1,
            )
        )
        shared.append(table.name)
    del graph.node[:]
    graph.node.extend(rewritten)
    read = {name for node in graph.node for name in node.input}
    for name in shared:
        if name not in read:
            graph.initializer.remove(initializers[name])
    return shared


def _head(node: Any, initializers: dict[str, Any], heads: dict[str, Any], block_size: int) -> Any:
    """The `MatMulNBits` holding `node`'s table when `node` is a Gather its blocks can
    replace, else None."""
    from onnx import TensorProto, helper

    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
        return None
    table = initializers.get(node.input[0])
    if table is None or len(table.dims) != 2 or table.data_type != TensorProto.FLOAT:
        return None
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
    head = heads.get(f"{table.name}{TRANSPOSED}_Q4")
    if head is None or axis != 0 or table.dims[1] % block_size:
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in head.attribute}
    symmetric = len(head.input) < 4 or not head.input[3]
    fits = (attributes.get("K"), attributes.get("N")) == (table.dims[1], table.dims[0])
    if not fits or attributes.get("bits") != 4 or not symmetric:
        return None
    if attributes.get("block_size") != block_size:
        return None
    return head
