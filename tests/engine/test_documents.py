"""graph.json, signature.json and the model summary, read from real exported programs."""

from __future__ import annotations

import functools
import importlib.util
import json
import operator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.export import Dim

from engine.decompose.decomposition import decompose
from engine.diagnostics.source_map import SourceMap
from engine.serialize.documents import (
    graph_document,
    model_summary,
    op_histogram,
    render_argument,
    signature_document,
    target_name,
)
from schemas import (
    DecompositionOptions,
    Graph,
    GraphDocument,
    GraphNode,
    PortabilityMapping,
    SignatureDocument,
)

MODELS = Path(__file__).parent.parent / "models"


@functools.cache
def _fixture(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"doc_fixture_{name}", MODELS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _program(name: str) -> torch.export.ExportedProgram:
    """The fixture exported and decomposed to core ATen, as the pipeline does."""
    fixture = _fixture(name)
    ep = torch.export.export(
        fixture.model,
        fixture.example_args,
        getattr(fixture, "example_kwargs", None),
        dynamic_shapes=getattr(fixture, "dynamic_shapes", None),
    )
    return decompose(ep, DecompositionOptions()).ep


def _line_of(name: str, text: str) -> int:
    lines = (MODELS / f"{name}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def _nodes(graph: Graph) -> list[GraphNode]:
    return [*graph.nodes, *(n for sub in graph.subgraphs.values() for n in _nodes(sub))]


@pytest.fixture(scope="module")
def nested_graph() -> GraphDocument:
    return graph_document(_program("doc_nested"), SourceMap(MODELS))


# --- graph.json ----------------------------------------------------------------------------


def test_cond_branches_are_subgraphs(nested_graph: GraphDocument) -> None:
    graph = nested_graph.graph
    assert sorted(graph.subgraphs) == ["false_graph_0", "true_graph_0"]
    true_targets = [n.target for n in graph.subgraphs["true_graph_0"].nodes]
    false_targets = [n.target for n in graph.subgraphs["false_graph_0"].nodes]
    assert "aten.sin.default" in true_targets
    assert "aten.cos.default" in false_targets
    assert graph.subgraphs["true_graph_0"].inputs != []
    cond = next(n for n in graph.nodes if n.target == "higher_order.cond")
    assert cond.args[1:3] == [{"node": "true_graph_0"}, {"node": "false_graph_0"}]
    assert cond.outputs is not None and len(cond.outputs) == 1
    getitem = next(n for n in graph.nodes if n.target == "operator.getitem")
    assert getitem.args == [{"node": "cond"}, 0]


def test_op_histogram_counts_subgraphs_unless_asked_not_to(
    nested_graph: GraphDocument,
) -> None:
    gm = _program("doc_nested").graph_module
    assert nested_graph.op_histogram == op_histogram(gm)
    assert op_histogram(gm)["aten.sin.default"] == 1
    assert "aten.sin.default" not in op_histogram(gm, include_subgraphs=False)
    assert op_histogram(gm)["aten.addmm.default"] == 2


def test_dynamic_batch_is_a_symbol_with_its_range(nested_graph: GraphDocument) -> None:
    x = next(n for n in nested_graph.graph.nodes if n.name == "x")
    assert x.op == "placeholder"
    assert isinstance(x.shape, list) and isinstance(x.shape[0], str)
    assert x.shape[1] == 4
    assert x.dtype == "float32"
    [constraint] = nested_graph.range_constraints
    assert constraint.symbol == x.shape[0]
    assert (constraint.min, constraint.max) == (2, 64)


def test_nodes_point_to_the_users_file_and_line(nested_graph: GraphDocument) -> None:
    gt = next(n for n in nested_graph.graph.nodes if n.target == "aten.gt.Scalar")
    assert gt.source is not None
    assert gt.source.file == "doc_nested.py"
    assert gt.source.line == _line_of("doc_nested", "torch.cond(")
    assert gt.source.code is not None and gt.source.code.startswith("z = torch.cond(")
    # a node made inside nn.Linear points at the user's call, not into torch
    addmm = next(n for n in nested_graph.graph.nodes if n.target == "aten.addmm.default")
    assert addmm.source is not None
    assert addmm.source.line == _line_of("doc_nested", "return self.proj(x).relu()")


def test_module_stack_names_the_nested_submodule(nested_graph: GraphDocument) -> None:
    second = [
        n
        for n in nested_graph.graph.nodes
        if n.module_stack and n.module_stack[-1].path == "blocks.1.proj"
    ]
    assert [n.target for n in second] == ["aten.permute.default", "aten.addmm.default"]
    assert [(f.path, f.type) for f in second[0].module_stack] == [
        ("blocks", "Sequential"),
        ("blocks.1", "Inner"),
        ("blocks.1.proj", "Linear"),
    ]
    relu = [n for n in nested_graph.graph.nodes if n.target == "aten.relu.default"]
    assert [n.module_stack[-1].path for n in relu] == ["blocks.0", "blocks.1"]


def test_graph_inputs_and_outputs_are_named(nested_graph: GraphDocument) -> None:
    graph = nested_graph.graph
    assert graph.inputs[-5:] == ["x", "extras_pair_0", "extras_pair_1", "scale", "bias"]
    names = {n.name for n in graph.nodes}
    assert len(graph.outputs) == 2 and set(graph.outputs) <= names


def test_graph_document_is_valid_json_of_the_contract(nested_graph: GraphDocument) -> None:
    text = json.dumps(nested_graph.model_dump(mode="json"))
    assert GraphDocument.model_validate(json.loads(text)) == nested_graph


def test_graph_document_of_the_program_as_exported() -> None:
    fixture = _fixture("decomp_conv_bn")
    ep = torch.export.export(fixture.model, fixture.example_args)
    document = graph_document(ep, SourceMap(MODELS))
    conv = next(n for n in document.graph.nodes if n.target == "aten.conv2d.default")
    assert conv.shape == [2, 4, 6, 6]
    assert conv.module_stack[-1].path == "conv"
    assert conv.source is not None and conv.source.file == "decomp_conv_bn.py"
    assert document.range_constraints == []


# --- signature.json ------------------------------------------------------------------------


def test_user_inputs_carry_their_pytree_paths() -> None:
    fixture = _fixture("doc_nested")
    spec_json = {"x": {"0": {"name": "batch", "min": 2, "max": 64}}}
    document = signature_document(
        _program("doc_nested"),
        args=fixture.example_args,
        kwargs=fixture.example_kwargs,
        dynamic_shapes_json=spec_json,
    )
    users = [spec for spec in document.inputs if spec.kind == "user_input"]
    assert [(s.name, s.pytree_path) for s in users] == [
        ("x", "args[0]"),
        ("extras_pair_0", "args[1]['pair'][0]"),
        ("extras_pair_1", "args[1]['pair'][1]"),
        ("scale", "kwargs['scale']"),
        ("bias", "kwargs['bias']"),
    ]
    scale = users[3]
    assert scale.value == 2.0 and scale.shape is None
    assert users[0].shape is not None and isinstance(users[0].shape[0], str)
    params = [spec for spec in document.inputs if spec.kind == "parameter"]
    assert [p.target for p in params] == [
        "blocks.0.proj.weight",
        "blocks.0.proj.bias",
        "blocks.1.proj.weight",
        "blocks.1.proj.bias",
    ]
    assert all(p.pytree_path is None for p in params)
    outputs = [(o.kind, o.pytree_path, o.dtype) for o in document.outputs]
    assert outputs == [
        ("user_output", "[0]", "float32"),
        ("user_output", "[1]['first']", "float32"),
    ]
    assert document.range_constraints[0].max == 64
    dumped = document.model_dump(mode="json", exclude_none=True)
    assert dumped["dynamic_shapes"] == spec_json
    assert document.in_spec is not None and json.loads(document.in_spec)[0] >= 1
    assert document.out_spec is not None
    assert document.portability == PortabilityMapping(wrapped=False)


def test_buffer_mutations_appear_as_outputs_with_their_buffer() -> None:
    fixture = _fixture("decomp_conv_bn")
    document = signature_document(
        _program("decomp_conv_bn"),
        args=fixture.example_args,
        kwargs={},
        dynamic_shapes_json=None,
    )
    outputs = [(o.kind, o.target, o.shape, o.dtype) for o in document.outputs]
    assert outputs == [
        ("buffer_mutation", "bn.running_mean", [4], "float32"),
        ("buffer_mutation", "bn.running_var", [4], "float32"),
        ("buffer_mutation", "bn.num_batches_tracked", [], "int64"),
        ("user_output", None, [2, 4, 6, 6], "float32"),
    ]
    assert document.outputs[-1].pytree_path == ""  # forward returns a bare tensor
    buffers = [(i.target, i.persistent) for i in document.inputs if i.kind == "buffer"]
    assert buffers == [
        ("bn.running_mean", True),
        ("bn.running_var", True),
        ("bn.num_batches_tracked", True),
    ]
    assert document.inputs[-1].pytree_path == "args[0]"
    assert SignatureDocument.model_validate(document.model_dump(mode="json")) == document


def test_unbounded_dimension_has_null_max() -> None:
    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    ep = torch.export.export(
        Double(), (torch.randn(4, 2),), dynamic_shapes={"x": {0: Dim("n", min=3)}}
    )
    document = signature_document(
        ep, args=(torch.randn(4, 2),), kwargs={}, dynamic_shapes_json=None
    )
    [constraint] = document.range_constraints
    assert (constraint.min, constraint.max) == (3, None)
    assert document.outputs[0].pytree_path == ""


# --- model summary and small pieces ---------------------------------------------------------


def test_model_summary_counts_elements_by_dtype() -> None:
    model = _fixture("decomp_conv_bn").model
    summary = model_summary(_program("decomp_conv_bn"))
    expected_params = sum(p.numel() for p in model.parameters())
    assert summary.parameters == {"float32": expected_params}
    assert summary.parameter_count == expected_params
    assert summary.buffers == {"float32": 8, "int64": 1}
    assert summary.buffer_count == 9
    assert summary.inputs == [{"name": "x", "shape": [2, 3, 8, 8], "dtype": "float32"}]
    assert [o["shape"] for o in summary.outputs] == [[2, 4, 6, 6]]


def test_model_summary_of_constant_and_symbolic_inputs() -> None:
    summary = model_summary(_program("doc_nested"))
    by_name = {entry["name"]: entry for entry in summary.inputs}
    assert by_name["scale"] == {"name": "scale", "type": "float", "value": 2.0}
    assert isinstance(by_name["x"]["shape"][0], str)


@pytest.mark.parametrize(
    ("target", "text"),
    [
        (torch.ops.aten.add.Tensor, "aten.add.Tensor"),
        (torch.ops.higher_order.cond, "higher_order.cond"),
        (operator.getitem, "operator.getitem"),
        (torch.sym_float, "torch.sym_float"),
        ("p_weight", "p_weight"),
    ],
)
def test_targets_are_written_as_torch_prints_them(target: object, text: str) -> None:
    assert target_name(target) == text


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        (torch.float16, "torch.float16"),
        (torch.device("cpu"), "cpu"),
        (float("inf"), "inf"),
        ((1, [2.5, None]), [1, [2.5, None]]),
        ({"k": True}, {"k": True}),
        (torch.zeros(2, 3, dtype=torch.int8), "tensor(shape=[2, 3], dtype=int8)"),
    ],
)
def test_arguments_render_as_json(value: object, rendered: object) -> None:
    assert render_argument(value) == rendered
    json.dumps(render_argument(value))
