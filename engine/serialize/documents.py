"""The JSON documents of an exported program: `graph.json`, `signature.json`, the model summary.

Everything here reads an `ExportedProgram` and returns a pydantic model of `schemas`; no
torch object leaks into the output. Conventions:

- op targets are written as torch prints them without the `torch.ops.` prefix:
  `aten.add.Tensor`, `higher_order.cond`, `operator.getitem`;
- dtypes of values are bare names (`float32`); dtypes, devices and layouts appearing as
  node arguments are written as torch prints them (`torch.float32`, `cpu`);
- symbolic sizes are their sympy expression as text, each symbol under the name the
  user's dynamic-shapes spec gave it (`batch`, `2*batch + 1`; `engine.shapes.dim_names`), else
  torch's (`s77`);
- pytree paths of user inputs are `args[0]['a'][1]` / `kwargs['mask']`; those of user
  outputs are `pytree.keystr` of the output (`[0]`, or `""` for a single tensor), as in
  the verification report.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from engine.diagnostics.source_map import SourceMap
from engine.shapes.dim_names import DimNames, rename
from engine.trace.graph_ops import op_histogram, subgraphs, target_name
from schemas import (
    Graph,
    GraphDocument,
    GraphNode,
    InputSpec,
    ModelSummary,
    ModuleFrame,
    OutputSpec,
    PortabilityMapping,
    RangeConstraint,
    SignatureDocument,
    TensorMeta,
)

_REPR_LIMIT = 200
_OP_NAME = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]\w*$")
"""`namespace.op.overload`, as torch prints an operator."""
"""Longest repr of an odd argument kept in graph.json; longer ones are cut."""


# --- shared pieces -----------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` → `float32`."""
    return str(dtype).removeprefix("torch.")


def symbolic_int(value: Any, names: DimNames | None = None) -> int | str:
    """An int, or the expression of a symbolic int as text (`batch`, `2*s0 + 1`)."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        if getattr(expr, "is_number", False):
            return int(expr)
        return rename(expr, names)
    return int(value)


def shape_of(tensor: torch.Tensor, names: DimNames | None = None) -> list[int | str]:
    """The sizes of a (fake) tensor, symbols as text under the user's names."""
    return [symbolic_int(size, names) for size in tensor.shape]


def range_constraints(ep: ExportedProgram, names: DimNames | None = None) -> list[RangeConstraint]:
    """The program's symbols and their ranges, sorted by symbol; unbounded ends are null."""
    out = [
        RangeConstraint(symbol=rename(symbol, names), min=_bound(vr.lower), max=_bound(vr.upper))
        for symbol, vr in ep.range_constraints.items()
    ]
    return sorted(out, key=lambda rc: _natural_key(rc.symbol))


def _bound(value: Any) -> int | None:
    from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

    # int_oo claims to be finite to sympy, so it is checked by type first
    if isinstance(value, IntInfinity | NegativeIntInfinity):
        return None
    try:
        if value.is_number and value.is_integer:
            return int(value)
    except AttributeError:
        if isinstance(value, int):
            return value
    return None


def _natural_key(text: str) -> tuple[Any, ...]:
    head = text.rstrip("0123456789")
    tail = text[len(head) :]
    return (head, int(tail) if tail else -1, text)


# --- graph.json --------------------------------------------------------------------------


def graph_document(
    ep: ExportedProgram, source_map: SourceMap, names: DimNames | None = None
) -> GraphDocument:
    """`graph.json`: every node with its arguments, shapes, user source and module path;
    `names` gives the user's dim names for torch's symbols."""
    return GraphDocument(
        graph=_graph(ep.graph_module, source_map, frozenset(), names),
        op_histogram=op_histogram(ep.graph_module),
        range_constraints=range_constraints(ep, names),
    )


def _graph(
    gm: torch.fx.GraphModule,
    source_map: SourceMap,
    parents: frozenset[int],
    names: DimNames | None = None,
) -> Graph:
    nodes = [_node(node, source_map, names) for node in gm.graph.nodes]
    inputs = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
    outputs: list[str] = []
    for node in gm.graph.nodes:
        if node.op == "output":
            outputs = [
                leaf.name if isinstance(leaf, torch.fx.Node) else repr(leaf)
                for leaf in pytree.tree_leaves(node.args[0] if node.args else ())
            ]
    inner = parents | {id(gm)}
    return Graph(
        nodes=nodes,
        inputs=inputs,
        outputs=outputs,
        subgraphs={
            name: _graph(sub, source_map, inner, names)
            for name, sub in subgraphs(gm).items()
            if id(sub) not in inner  # a graph cannot contain itself; guard anyway
        },
    )


def _node(node: torch.fx.Node, source_map: SourceMap, names: DimNames | None) -> GraphNode:
    val = node.meta.get("val")
    shape = dtype = outputs = None
    if isinstance(val, torch.Tensor):
        shape, dtype = shape_of(val, names), dtype_name(val.dtype)
    elif isinstance(val, list | tuple):
        outputs = [
            TensorMeta(shape=shape_of(v, names), dtype=dtype_name(v.dtype))
            if isinstance(v, torch.Tensor)
            else None
            for v in val
        ]
    stack_trace = node.meta.get("stack_trace")
    source = source_map.from_text(stack_trace) if stack_trace else None
    return GraphNode(
        name=node.name,
        op=node.op,
        target=target_name(node.target),
        args=[render_argument(a) for a in node.args],
        kwargs={str(k): render_argument(v) for k, v in node.kwargs.items()},
        shape=shape,
        dtype=dtype,
        outputs=outputs,
        source=source,
        library_source=source_map.library_frame(stack_trace)
        if stack_trace and source is None
        else None,
        module_stack=module_stack(node),
        decomposed_from=decomposed_from(node),
    )


def decomposed_from(node: torch.fx.Node) -> str | None:
    """The op of the traced program `node` was decomposed from, when it is another op (the
    provenance `run_decompositions` records in `from_node`)."""
    if node.op != "call_function":
        return None
    origins = node.meta.get("from_node") or []
    origin = getattr(origins[0], "target", None) if origins else None
    if not isinstance(origin, str) or not _OP_NAME.match(origin):
        return None  # not an operator (a builtin's repr, a placeholder's name)
    return None if origin == target_name(node.target) else origin


def render_argument(value: Any) -> Any:
    """A node argument as JSON: node references as `{"node": name}`, odd objects as text."""
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [render_argument(v) for v in value]
    if isinstance(value, dict):
        return {str(k): render_argument(v) for k, v in value.items()}
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return str(value.node.expr)
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={shape_of(value)}, dtype={dtype_name(value.dtype)})"
    if isinstance(value, torch.dtype | torch.layout | torch.memory_format | torch.device):
        return str(value)
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def module_stack(node: torch.fx.Node) -> list[ModuleFrame]:
    """The submodules a node came from, outermost first; the root module is left out."""
    stack = node.meta.get("nn_module_stack") or {}
    frames = []
    for key, entry in stack.items():
        if not isinstance(entry, tuple) or len(entry) != 2:
            continue
        path, kind = entry
        # export marks nodes it created itself (e.g. sym_size) with this placeholder entry
        if not isinstance(path, str) or str(key).startswith("_empty_nn_module_stack"):
            continue
        path = path.removeprefix("L['self']").removeprefix(".")
        if not path:
            continue
        type_name = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]
        frames.append(ModuleFrame(path=path, type=type_name))
    return frames


# --- signature.json ----------------------------------------------------------------------


def signature_document(
    ep: ExportedProgram,
    *,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes_json: Any,
    portability: PortabilityMapping | None = None,
    names: DimNames | None = None,
) -> SignatureDocument:
    """`signature.json`: every input and output of the graph and where user leaves sit.

    Args:
        ep: the final program.
        args, kwargs: the example inputs it was exported with; their pytree paths name
            the user inputs when the program's own input spec cannot.
        dynamic_shapes_json: the dynamic-shapes spec used, in the contract's JSON form.
        portability: how a portable wrapper's containers map to the model's own types.
        names: the user's dim names for torch's symbols (`engine.shapes.dim_names`).
    """
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    input_paths = iter(_input_paths(ep, args, kwargs))
    inputs = []
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", "")
        meta = _value_meta(placeholders.get(name), names)
        user = spec.kind == InputKind.USER_INPUT
        inputs.append(
            InputSpec(
                kind=spec.kind.name.lower(),
                name=name,
                target=spec.target,
                persistent=spec.persistent,
                shape=meta[0],
                dtype=meta[1],
                pytree_path=next(input_paths, None) if user else None,
                value=_constant(spec.arg) if user else None,
            )
        )
    output_values = _output_values(ep)
    output_paths = iter(_tree_paths(ep.call_spec.out_spec, prefix=False))
    outputs = []
    for index, spec in enumerate(ep.graph_signature.output_specs):
        value = output_values[index] if index < len(output_values) else None
        meta = _value_meta(value if isinstance(value, torch.fx.Node) else None, names)
        user = spec.kind == OutputKind.USER_OUTPUT
        outputs.append(
            OutputSpec(
                kind=spec.kind.name.lower(),
                name=getattr(spec.arg, "name", "") or "",
                target=spec.target,
                shape=meta[0],
                dtype=meta[1],
                pytree_path=next(output_paths, None) if user else None,
            )
        )
    return SignatureDocument(
        inputs=inputs,
        outputs=outputs,
        range_constraints=range_constraints(ep, names),
        dynamic_shapes=dynamic_shapes_json,
        in_spec=_dumps(ep.call_spec.in_spec),
        out_spec=_dumps(ep.call_spec.out_spec),
        portability=portability or PortabilityMapping(wrapped=False),
    )


def _input_paths(ep: ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """Paths of the user inputs, in the program's order.

    The program's in_spec is what the graph was traced with; the example inputs are the
    fallback when the spec holds a container type without key paths.
    """
    user_count = sum(
        1 for spec in ep.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT
    )
    paths = _tree_paths(ep.call_spec.in_spec, prefix=True)
    if len(paths) == user_count:
        return paths
    try:
        flat = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))[0]
    except Exception:  # a container type pytree cannot give key paths for
        return []
    return [_prefixed(path) for path, _ in flat]


def _tree_paths(spec: pytree.TreeSpec | None, *, prefix: bool) -> list[str]:
    if spec is None:
        return []
    try:
        skeleton = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
        flat = pytree.tree_flatten_with_path(skeleton)[0]
    except Exception:  # a registered node type without flatten_with_keys
        return []
    return [_prefixed(path) if prefix else pytree.keystr(path) for path, _ in flat]


def _prefixed(path: tuple[Any, ...]) -> str:
    """`(SequenceKey(0), SequenceKey(1))` → `args[1]`; a first key of 1 means kwargs."""
    if not path:
        return ""
    head = "kwargs" if getattr(path[0], "idx", 0) == 1 else "args"
    return head + pytree.keystr(path[1:])


def _output_values(ep: ExportedProgram) -> list[Any]:
    for node in ep.graph.nodes:
        if node.op == "output":
            values = node.args[0] if node.args else ()
            return list(values) if isinstance(values, list | tuple) else [values]
    return []


def _value_meta(
    node: torch.fx.Node | None, names: DimNames | None
) -> tuple[list[int | str] | None, str | None]:
    val = node.meta.get("val") if node is not None else None
    if isinstance(val, torch.Tensor):
        return shape_of(val, names), dtype_name(val.dtype)
    return None, None


def _constant(arg: Any) -> Any:
    from torch.export.graph_signature import ConstantArgument

    if isinstance(arg, ConstantArgument):
        return render_argument(arg.value)
    return None


def _dumps(spec: pytree.TreeSpec | None) -> str | None:
    if spec is None:
        return None
    try:
        return pytree.treespec_dumps(spec)
    except Exception:  # a node type without a serialized name cannot be written
        return None


# --- model summary ------------------------------------------------------------------------


def model_summary(ep: ExportedProgram, names: DimNames | None = None) -> ModelSummary:
    """Parameters and buffers by dtype (element counts), and the user inputs and outputs."""
    signature = ep.graph_signature
    parameters: Counter[str] = Counter()
    buffers: Counter[str] = Counter()
    for keys, counter in ((signature.parameters, parameters), (signature.buffers, buffers)):
        for name in keys:
            tensor = ep.state_dict.get(name)
            if tensor is None:
                tensor = ep.constants.get(name)  # non-persistent buffers live there
            if isinstance(tensor, torch.Tensor):
                counter[dtype_name(tensor.dtype)] += tensor.numel()
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = [
        _leaf_summary(name, placeholders.get(name), spec.arg, names)
        for spec in signature.input_specs
        for name in [getattr(spec.arg, "name", "")]
        if spec.kind == InputKind.USER_INPUT
    ]
    values = _output_values(ep)
    outputs = [
        _leaf_summary(
            getattr(spec.arg, "name", "") or "",
            values[i] if i < len(values) and isinstance(values[i], torch.fx.Node) else None,
            spec.arg,
            names,
        )
        for i, spec in enumerate(signature.output_specs)
        if spec.kind == OutputKind.USER_OUTPUT
    ]
    return ModelSummary(
        parameters=dict(sorted(parameters.items())),
        buffers=dict(sorted(buffers.items())),
        parameter_count=sum(parameters.values()),
        buffer_count=sum(buffers.values()),
        inputs=inputs,
        outputs=outputs,
    )


def _leaf_summary(
    name: str, node: torch.fx.Node | None, arg: Any, names: DimNames | None
) -> dict[str, Any]:
    val = node.meta.get("val") if node is not None else getattr(arg, "value", None)
    if isinstance(val, torch.Tensor):
        return {"name": name, "shape": shape_of(val, names), "dtype": dtype_name(val.dtype)}
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        return {"name": name, "type": type(val).__name__, "expr": rename(val.node.expr, names)}
    return {"name": name, "type": type(val).__name__, "value": render_argument(val)}
