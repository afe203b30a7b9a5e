"""`graph.json`: the exported graph, readable without torch."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from schemas._base import SCHEMA_VERSION, StrictModel
from schemas.errors import SourceLocation

Shape = list[int | str]
"""Sizes; a symbolic size is its expression as text, e.g. `"s0"` or `"2*s0 + 1"`."""


class TensorMeta(StrictModel):
    """Shape and dtype of one tensor value."""

    shape: Shape
    dtype: str


class ModuleFrame(StrictModel):
    """One level of the `nn.Module` hierarchy a node came from."""

    path: str = Field(description='Attribute path from the root, e.g. "encoder.layers.0".')
    type: str = Field(description="Class name, e.g. `Linear`.")


class LibraryLocation(StrictModel):
    """A place in library code (an installed package), never a server path."""

    file: str = Field(
        description="Path from the import root it was loaded from, e.g. "
        "`transformers/models/bert/modeling_bert.py`."
    )
    line: int
    code: str | None = Field(default=None, description="The source line, stripped.")


class GraphNode(StrictModel):
    """One FX node."""

    name: str
    op: str = Field(description="placeholder | call_function | get_attr | output | ...")
    target: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    shape: Shape | None = None
    dtype: str | None = None
    outputs: list[TensorMeta | None] | None = Field(
        default=None, description="Per-element metadata for nodes that return several values."
    )
    source: SourceLocation | None = None
    library_source: LibraryLocation | None = Field(
        default=None,
        description="For a node without `source` (no frame of the upload in its stack): the "
        "deepest frame of its stack outside torch, in library code (the deepest frame when "
        "all are torch's); null when the node has no stack.",
    )
    module_stack: list[ModuleFrame] = Field(default_factory=list)
    decomposed_from: str | None = Field(
        default=None,
        description="The op of the traced program this node was decomposed from, when that "
        "is another op (`aten.linear.default` for an `aten.addmm.default`); null otherwise.",
    )


class RangeConstraint(StrictModel):
    """The range a symbol of the program is valid for."""

    symbol: str
    min: int | None
    max: int | None = Field(description="null when unbounded.")


class Graph(StrictModel):
    """A graph and the subgraphs it calls (bodies of `cond`, `map`, ...)."""

    nodes: list[GraphNode]
    inputs: list[str]
    outputs: list[str]
    subgraphs: dict[str, Graph] = Field(default_factory=dict)


class GraphDocument(StrictModel):
    """The top level of `graph.json`."""

    schema_version: str = SCHEMA_VERSION
    graph: Graph
    op_histogram: dict[str, int]
    range_constraints: list[RangeConstraint]
