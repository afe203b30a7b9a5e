"""ONNX's 4-bit schemes (`engine.quantization.onnx_runtime`): `int4_weight_only` and `8da4w`
write `MatMulNBits` nodes by ONNX Runtime's `MatMulNBitsQuantizer` (4-bit symmetric blocks
of `quantize.group_size`, computing in float32 or in int8), judged by the accuracy budget
against float eager like every quantized artifact; an LLM's greedy tokens are compared.
Pipeline runs with ONNX exports on 2 shared cores: `slow`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.pipeline.export import ExportResult
from engine.quantization import METHODS, takes
from tests.engine.model_files import export_file

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow


def _export(tmp_path: Path, model: str, **quantize: object) -> ExportResult:
    """`model` exported to ONNX with option `quantize`, without profiles or round trip."""
    return export_file(
        tmp_path,
        model,
        {
            "targets": ["onnx"],
            "quantize": quantize,
            "profile": {"enabled": False},
            "verify": {"roundtrip": False},
        },
    )


def _nbits(path: Path) -> list[dict[str, int]]:
    """The attributes of each `MatMulNBits` node of the model at `path`."""
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    return [
        {attribute.name: attribute.i for attribute in node.attribute}
        for node in nodes
        if node.op_type == "MatMulNBits"
    ]


def test_onnx_takes_both_4bit_schemes_and_says_how() -> None:
    for scheme, level in (("int4_weight_only", "accuracy_level 1"), ("8da4w", "accuracy_level 4")):
        assert takes("onnx", scheme)
        assert "MatMulNBits" in METHODS[("onnx", scheme)] and level in METHODS[("onnx", scheme)]


@pytest.mark.parametrize(("scheme", "level"), [("int4_weight_only", 1), ("8da4w", 4)])
def test_an_encoders_linears_become_4bit_blocks_within_the_budget(
    tmp_path: Path, scheme: str, level: int
) -> None:
    result = _export(tmp_path, "quant_bert.py", scheme=scheme, group_size=64, min_cosine=0.98)
    report = result.report
    assert report.status == "succeeded", report.error
    target = report.targets["onnx"]
    assert target.status == "succeeded", target.error
    nbits = _nbits(result.artifacts["model.onnx"])
    # Two layers of six linears each (query, key, value, output, intermediate, output).
    assert len(nbits) == 12
    assert all(n["bits"] == 4 and n["block_size"] == 64 for n in nbits)
    assert {n["accuracy_level"] for n in nbits} == {level}
    quantization = report.quantization
    assert quantization is not None and quantization.group_size == 64
    entry = quantization.targets["onnx"]
    assert entry.method == METHODS[("onnx", scheme)]
    assert entry.measured and entry.samples == 4
    assert entry.cosine is not None and entry.cosine >= 0.98
    assert entry.passed is True
    assert target.verification is not None and target.verification.verdict == "verified"
    # The linears' float32 weights (2 x 786,432 B) are now 4-bit with a scale per 64.
    assert target.size is not None and target.size < 700_000


def test_a_2d_linears_gemm_is_quantized_too(tmp_path: Path) -> None:
    """The exporter writes a 2-D input's linear as `Gemm`, which ONNX Runtime's quantizer
    leaves float: it becomes MatMul and Add by a transposed constant first."""
    result = _export(tmp_path, "quant_mlp.py", scheme="int4_weight_only")
    report = result.report
    target = report.targets["onnx"]
    assert target.status == "succeeded", target.error
    graph = onnx.load(str(result.artifacts["model.onnx"]), load_external_data=False).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("MatMulNBits") == 2 and "Gemm" not in ops
    assert {n["block_size"] for n in _nbits(result.artifacts["model.onnx"])} == {32}
    # 2 x 131,072 float32 weights (1 MiB) now 4-bit, a float32 scale per 32.
    assert target.size is not None and target.size < 200_000
    assert report.quantization is not None
    entry = report.quantization.targets["onnx"]
    assert entry.passed is True and entry.cosine is not None and entry.cosine >= 0.99


def test_a_model_without_linears_is_refused_not_left_float(tmp_path: Path) -> None:
    result = _export(tmp_path, "docs_conv_batchnorm.py", scheme="8da4w")
    report = result.report
    assert report.status == "succeeded"  # program.pt2 is kept
    error = report.targets["onnx"].error
    assert error is not None and error.code == "target_failed"
    assert error.details["reason"] == "nothing_quantized"
    assert error.details["scheme"] == "8da4w"
    assert "model.onnx" not in result.artifacts


@pytest.mark.timeout(600)  # a generation-ready LLM's ONNX conversion on 2 shared cores
def test_a_generation_ready_llamas_4bit_onnx_compares_greedy_tokens(tmp_path: Path) -> None:
    from tests.engine.test_checkpoints import export, zip_directory
    from tests.engine.test_generation import TEXT_GENERATION, llama
    from tests.engine.test_quantization import assert_tokens_matched_from_the_first

    archive = zip_directory(llama(tmp_path), tmp_path / "model.zip")
    options = {
        **TEXT_GENERATION,
        "verify": {"roundtrip": False, "samples": 0},
        "generation": {"max_new_tokens": 6},
        "targets": ["onnx"],
        "quantize": {"scheme": "int4_weight_only"},
        "profile": {"enabled": False},
    }
    result = export(tmp_path, archive, options)
    report = result.report
    assert report.status == "succeeded", report.error
    target = report.targets["onnx"]
    assert target.status == "succeeded", target.error
    assert len(_nbits(result.artifacts["model.onnx"])) > 0
    assert report.generation is not None and report.generation.check is not None
    assert report.quantization is not None
    entry = report.quantization.targets["onnx"]
    assert entry.measured is True and entry.generation is not None
    assert_tokens_matched_from_the_first(entry, report.generation.check)


def _tied_head(hidden: int = 64) -> tuple[Any, Any]:
    """A model whose embedding's weight W is also its LM head's, as `Transpose(W)`; it
    returns the embedded rows too."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((96, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["W", "ids"], ["embedded"]),
            helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
            helper.make_node("MatMul", ["embedded", "Wt"], ["logits"]),
        ],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 96]),
            helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [1, 4, hidden]),
        ],
        [numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight


def _quantized_tied(tmp_path: Path, hidden: int) -> tuple[Any, Any, Path]:
    """`_tied_head` written as the target writes it and quantized to 4 bits, blocks of 32."""
    import onnx_ir as ir

    from engine.quantization.onnx_runtime import _blocks
    from engine.targets.onnx import weights

    tied, weight = _tied_head(hidden)
    model = ir.from_proto(tied)
    weights.transposed(model)
    source, path = tmp_path / "float.onnx", tmp_path / "model.onnx"
    ir.save(model, source)
    _blocks(source, path, block_size=32, accuracy_level=1, external=False)
    return onnx.load(str(path)), weight, path


def _cosine(got: Any, want: Any) -> float:
    import numpy as np

    return float(got.ravel() @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want)))


def test_a_tied_lm_heads_weight_is_quantized_and_its_embedding_reads_the_same_blocks(
    tmp_path: Path,
) -> None:
    """The exporter leaves `Transpose(W)` unfolded for a weight over its folding limit (a
    tied LM head's): the target writes the transposed weight (`onnx.weights`), the
    MatMul by it is quantized, and the embedding's Gather becomes `GatherBlockQuantized`
    on the head's 4-bit blocks (`onnx_embedding`): W leaves the model, as the builder's
    tied int4 models hold one table."""
    import numpy as np
    import onnxruntime
    from onnx import numpy_helper

    written, weight, path = _quantized_tied(tmp_path, hidden=64)
    kinds = [node.op_type for node in written.graph.node]
    assert kinds == ["Reshape", "GatherBlockQuantized", "MatMulNBits"]
    stored = {tensor.name: numpy_helper.to_array(tensor) for tensor in written.graph.initializer}
    assert "W" not in stored and not any(
        a.dtype == np.float32 and a.size == weight.size for a in stored.values()
    )

    ids = np.array([[1, 5, 7, 90]], dtype=np.int64)
    logits, embedded = onnxruntime.InferenceSession(str(path)).run(None, {"ids": ids})
    # the gathered rows are exactly the head's dequantized rows: one table, read twice
    blocks, scales = stored["W_transposed_Q4"], stored["W_transposed_scales"]
    nibbles = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(96, 64).astype(np.float32)
    rows = (nibbles - 8) * np.repeat(scales, 32, axis=1)
    np.testing.assert_allclose(embedded[0], rows[ids[0]], rtol=0, atol=1e-6)
    assert _cosine(embedded, weight[ids]) > 0.98  # 4-bit noise
    assert _cosine(logits, weight[ids] @ weight.T) > 0.98  # untransposed would give ~0


def test_a_tied_table_whose_rows_the_blocks_do_not_divide_stays_float(tmp_path: Path) -> None:
    """A hidden size of 48 in blocks of 32: the head pads its rows, so the embedding keeps
    its float Gather on W."""
    import numpy as np
    import onnxruntime

    written, weight, path = _quantized_tied(tmp_path, hidden=48)
    assert [node.op_type for node in written.graph.node] == ["Gather", "MatMulNBits"]
    assert written.graph.node[0].input[0] == "W"
    ids = np.array([[1, 5, 7, 90]], dtype=np.int64)
    logits, embedded = onnxruntime.InferenceSession(str(path)).run(None, {"ids": ids})
    np.testing.assert_array_equal(embedded, weight[ids])
    assert _cosine(logits, weight[ids] @ weight.T) > 0.98


def test_the_onnx_target_writes_a_tied_heads_weight_transposed(tmp_path: Path) -> None:
    """`onnx.weights.transposed` (the target's models it quantizes to 4 bits): the MatMul
    takes a transposed initializer, written as the model is saved; outputs unchanged."""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime

    from engine.targets.onnx import weights

    tied, weight = _tied_head()
    model = ir.from_proto(tied)
    assert weights.transposed(model) == 1
    path = tmp_path / "model.onnx"
    ir.save(model, path, external_data="model.onnx.data")
    written = onnx.load(str(path))
    assert [node.op_type for node in written.graph.node] == ["Gather", "MatMul"]
    assert written.graph.node[1].input[1] == "W_transposed"
    ids = np.array([[1, 5, 7, 90]], dtype=np.int64)
    got = onnxruntime.InferenceSession(str(path)).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got, weight[ids] @ weight.T, rtol=1e-5, atol=1e-4)
