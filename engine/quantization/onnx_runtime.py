"""`int8`, `int8_dynamic`, `int4_weight_only` and `8da4w` for the ONNX target: ONNX Runtime's
own quantization tools on the float `model.onnx`, as optimum's ONNX Runtime quantizer and
ONNX Runtime GenAI's model builder do (`quantize_static` with a calibration reader writes
QDQ pairs; `quantize_dynamic` int8 weights and activations quantized at run time, weights
per channel, symmetric; `MatMulNBitsQuantizer` 4-bit symmetric blocks of `group_size`
weights in `MatMulNBits` nodes, computing in float32 or, for `8da4w`, in int8 with the
activations quantized at run time)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.quantization.accuracy import CHECKED_SAMPLES
from engine.quantization.onnx_embedding import share_tied_embeddings

__all__ = ["ACCURACY_LEVELS", "DYNAMIC", "ONLY_LINEAR", "NothingQuantized", "quantize"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]

ACCURACY_LEVELS = {"int4_weight_only": 1, "8da4w": 4}
"""`MatMulNBits`' `accuracy_level` for each 4-bit scheme: 1 computes in float32, 4 in int8
(the builder's `-p int4` on CPU)."""


def quantize(
    path: Path,
    *,
    scheme: str,
    input_names: Sequence[str],
    calibration: Sequence[Inputs],
    group_size: int = 32,
    accept: Callable[[Any, Any], bool] | None = None,
    fallbacks: list[str] | None = None,
) -> Path:
    """Quantize the float model at `path` in place.

    Args:
        path: the float `model.onnx`.
        scheme: `int8`, `int8_dynamic`, `int4_weight_only` or `8da4w`.
        input_names: the model's inputs, one per tensor leaf of the inputs.
        calibration: the inputs static `int8` is calibrated on.
        group_size: the 4-bit schemes' block size (weights per scale).
        accept: for static `int8`, whether the quantized model's outputs (a list of
            arrays) are accurate enough against the float model's on a calibration
            input; when they are not on the first four, the model is quantized again
            with only Conv, MatMul by a constant and Gemm quantized (`ONLY_LINEAR`:
            quantized residual adds and attention MatMuls cost a transformer most of its
            accuracy), then, if that is not either, by `quantize_dynamic` (`DYNAMIC`);
            what was used is appended to `fallbacks`.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    float_path = path.with_name(path.stem + ".float.onnx")
    path.replace(float_path)
    external = path.with_name(path.name + ".data").exists()
    try:

        def dynamic_model() -> None:
            quantize_dynamic(
                float_path,
                path,
                per_channel=True,
                reduce_range=True,  # 7-bit weights: no u8s8 saturation on AVX2 CPUs
                weight_type=QuantType.QInt8,
                use_external_data_format=external,
                nodes_to_exclude=_batched_weight_matmuls(float_path),
            )

        if scheme in ACCURACY_LEVELS:
            _blocks(float_path, path, group_size, ACCURACY_LEVELS[scheme], external)
            return path
        if scheme == "int8_dynamic":
            dynamic_model()
            return path
        feeds = [_feed(input_names, each) for each in calibration]

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.left = iter(feeds)

            def get_next(self) -> dict[str, Any] | None:
                return next(self.left, None)

        def static_model(**extra: Any) -> None:
            quantize_static(
                float_path,
                path,
                Reader(),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                use_external_data_format=external,
                **extra,
            )

        def linears_only() -> None:
            static_model(
                op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                extra_options={"MatMulConstBOnly": True},
            )

        attempts: list[tuple[Callable[[], None], str | None]] = [(static_model, None)]
        if accept is not None:
            attempts += [(linears_only, ONLY_LINEAR), (dynamic_model, DYNAMIC)]
        for attempt, (make, note) in enumerate(attempts):
            make()
            last = attempt == len(attempts) - 1
            checked = feeds[:CHECKED_SAMPLES]
            if last or accept is None or _accurate(float_path, path, checked, accept):
                if note is not None and fallbacks is not None:
                    fallbacks.append(note)
                break
        return path
    finally:
        float_path.unlink(missing_ok=True)


ONLY_LINEAR = "only Conv, MatMul by a constant and Gemm quantized"
"""What the first fallback of static `int8` quantizes."""

DYNAMIC = "quantize_dynamic (activations quantized at run time)"
"""The second fallback: `int8_dynamic`'s model."""


class NothingQuantized(ValueError):
    """A 4-bit scheme found no MatMul or Gemm by a constant 2-D weight to quantize."""


def _blocks(source: Path, path: Path, block_size: int, accuracy_level: int, external: bool) -> None:
    """`source`'s MatMuls by a constant 2-D weight (Gemms by one rewritten as such first)
    as `MatMulNBits` (4-bit symmetric blocks of `block_size` along K), written to `path`;
    raises `NothingQuantized` when there is none."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    def quantized(model: Any) -> Any:
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=4,
            block_size=block_size,
            is_symmetric=True,
            accuracy_level=accuracy_level,
        )
        quantizer.process()
        return quantizer.model

    model = onnx.load(str(source))  # its external weights too
    _gemms_as_matmuls(model.graph)  # a MatMul by a transposed weight: `onnx.weights`
    if external:  # ONNX appends to an existing data file: start the quantized one afresh
        path.with_name(path.name + ".data").unlink()
    written = quantized(model)
    if not any(node.op_type == "MatMulNBits" for node in written.model.graph.node):
        raise NothingQuantized()
    share_tied_embeddings(written.model.graph, block_size)  # one 4-bit table, not two
    written.save_model_to_file(str(path), use_external_data_format=external)


def _gemms_as_matmuls(graph: Any) -> None:
    """Each `Gemm(A, B, C)` of `graph` by a constant 2-D B (alpha and beta 1, A not
    transposed; the exporter's 2-D linears) as `MatMul(A, B')` and `Add(C)`, B' the
    weight as MatMul takes it: `MatMulNBitsQuantizer` quantizes MatMuls only."""
    from onnx import helper, numpy_helper

    weights = {tensor.name: tensor for tensor in graph.initializer}
    nodes = list(graph.node)
    rewritten = []
    for node in nodes:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = weights.get(node.input[1]) if node.op_type == "Gemm" else None
        plain = attributes.get("alpha", 1.0) == 1.0 and attributes.get("beta", 1.0) == 1.0
        if weight is None or not plain or attributes.get("transA", 0) or len(weight.dims) != 2:
            rewritten.append(node)
            continue
        name = weight.name
        if attributes.get("transB", 0):
            name = f"{weight.name}_matmul"
            if name not in weights:
                weights[name] = numpy_helper.from_array(numpy_helper.to_array(weight).T, name)
                graph.initializer.append(weights[name])
        product = node.output[0] if len(node.input) < 3 else f"{node.output[0]}_matmul"
        rewritten.append(
            helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name}_matmul")
        )
        if len(node.input) >= 3:
            rewritten.append(
                helper.make_node(
                    "Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_add"
                )
            )
    del graph.node[:]
    graph.node.extend(rewritten)


def _accurate(
    float_path: Path,
    path: Path,
    feeds: Sequence[dict[str, Any]],
    accept: Callable[[Any, Any], bool],
) -> bool:
    """Whether the quantized model at `path` passes `accept` against the float one on
    each of `feeds` (both run in ONNX Runtime on the CPU)."""
    import onnxruntime

    providers = ["CPUExecutionProvider"]
    float_session = onnxruntime.InferenceSession(str(float_path), providers=providers)
    session = onnxruntime.InferenceSession(str(path), providers=providers)
    return all(accept(float_session.run(None, feed), session.run(None, feed)) for feed in feeds)


def _batched_weight_matmuls(path: Path) -> list[str]:
    """MatMul nodes whose B is a constant of rank 3 or more (a `bmm` against a stacked
    weight): ONNX Runtime's DynamicQuantizeMatMul takes per-channel parameters of a 2-D B
    only and fails at run time on the others ("b zero point is not valid"), so they stay
    float. Reads the graph without the external weights."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ranks = {tensor.name: len(tensor.dims) for tensor in graph.initializer}
    constants = {
        output: len(attribute.t.dims)
        for node in graph.node
        if node.op_type == "Constant"
        for attribute in node.attribute
        if attribute.name == "value"
        for output in node.output
    }
    ranks.update(constants)
    return [
        node.name
        for node in graph.node
        if node.op_type == "MatMul" and len(node.input) > 1 and ranks.get(node.input[1], 2) > 2
    ]


def _feed(names: Sequence[str], inputs: Inputs) -> dict[str, Any]:
    leaves = [
        leaf.detach().cpu().numpy()
        for leaf in pytree.tree_leaves((tuple(inputs[0]), dict(inputs[1])))
        if isinstance(leaf, torch.Tensor)
    ]
    return dict(zip(names, leaves, strict=False))
