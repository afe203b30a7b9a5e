"""The floating precision of an ONNX model (`onnx.dtype`): a bfloat16 or float16 model
widened to float32, which ONNX Runtime's CPU provider computes in (it has bfloat16 kernels
for few ops: a bfloat16 Llama's `Mul` has none), and a float32 model halved to float16."""

from __future__ import annotations

from typing import Any

__all__ = ["PROTOBUF_LIMIT", "fits_one_file", "half", "widen"]

PROTOBUF_LIMIT = 2**31
"""protobuf's limit on one serialized message: a single-file model must stay under it."""


def widen(model: Any) -> str | None:
    """Make every bfloat16 and float16 tensor of `model` (an `onnx_ir.Model`) float32, in
    place: initializers (each widened as it is written), values, inputs and outputs,
    `Cast` targets, dtype attributes and constants, subgraphs included. Returns
    "bfloat16" when any tensor was, else "float16" when any was, else None."""
    import numpy as np
    import onnx_ir as ir

    reduced = {ir.DataType.BFLOAT16: "bfloat16", ir.DataType.FLOAT16: "float16"}
    found: set[str] = set()

    def wide(tensor: Any) -> Any:
        found.add(reduced[tensor.dtype])
        return ir.tensor(np.asarray(tensor.numpy(), dtype=np.float32), name=tensor.name)

    def lazily_wide(tensor: Any) -> Any:
        """Widened as it is written (`onnx_ir.save` takes one tensor at a time): a
        1.24B model's float32 weights are never all in memory at once."""
        found.add(reduced[tensor.dtype])
        return ir.LazyTensor(
            lambda: ir.tensor(np.asarray(tensor.numpy(), dtype=np.float32)),
            dtype=ir.DataType.FLOAT,
            shape=tensor.shape,
            name=tensor.name,
        )

    def value(each: Any) -> None:
        if each is None:
            return
        if each.dtype in reduced:
            found.add(reduced[each.dtype])
            each.dtype = ir.DataType.FLOAT
        if each.const_value is not None and each.const_value.dtype in reduced:
            each.const_value = lazily_wide(each.const_value)

    graphs = [model.graph, *model.graph.subgraphs()]
    for graph in graphs:
        for each in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
            value(each)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for each in node.outputs:
            value(each)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and attr.value.dtype in reduced:
                node.attributes[attr.name] = ir.AttrTensor(attr.name, wide(attr.value))
            elif (
                attr.name in ("to", "dtype")  # Cast's target, a random or EyeLike's dtype
                and attr.type == ir.AttributeType.INT
                and attr.value in reduced
            ):
                found.add(reduced[ir.DataType(attr.value)])
                node.attributes[attr.name] = ir.AttrInt64(attr.name, ir.DataType.FLOAT)
    if not found:
        return None
    return "bfloat16" if "bfloat16" in found else "float16"


def fits_one_file(weights: int) -> None:
    """Refuse, before writing, weights that one file of this process may not hold
    (RLIMIT_FSIZE: in the sandbox, the worker's largest file for the job), where the
    write would fail half-way with a message that names no limit."""
    import resource

    from engine.targets.failures import TargetError

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY or weights <= limit:
        return
    raise TargetError(
        f"onnx: {weights} bytes of weights exceed the largest file this job may write "
        f"({limit} bytes)",
        hint="onnx.dtype float16 halves them; or have the worker's operator raise "
        "TORCHPORT_SANDBOX_FSIZE_MB. program.pt2 is unaffected.",
        details={"reason": "file_size_limit", "initializer_bytes": weights, "max_bytes": limit},
    )


def half(model: Any) -> Any:
    """The model with float32 weights and computation in float16 (ONNX Runtime's
    converter, as optimum uses it); inputs and outputs stay float32."""
    import onnx_ir as ir
    from onnxruntime.transformers.float16 import convert_float_to_float16

    large = (
        sum(
            v.const_value.nbytes
            for v in model.graph.initializers.values()
            if v.const_value is not None
        )
        >= PROTOBUF_LIMIT
    )
    proto = convert_float_to_float16(
        ir.to_proto(model), keep_io_types=True, disable_shape_infer=large
    )
    return ir.from_proto(proto)
