"""`signature.json`: how to call the exported program and what it returns."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from schemas._base import SCHEMA_VERSION, StrictModel
from schemas.dynamic_shapes import DynamicShapesSpec
from schemas.graph import RangeConstraint, Shape


class InputSpec(StrictModel):
    """One graph input."""

    kind: str = Field(description="user_input | parameter | buffer | constant_tensor | ...")
    name: str
    target: str | None = None
    persistent: bool | None = None
    shape: Shape | None = None
    dtype: str | None = None
    pytree_path: str | None = Field(
        default=None, description='For user inputs: where the leaf sits, e.g. "args[0]".'
    )
    value: Any = Field(default=None, description="For constant (non-tensor) user inputs.")


class OutputSpec(StrictModel):
    """One graph output."""

    kind: str = Field(description="user_output | buffer_mutation | user_input_mutation | ...")
    name: str
    target: str | None = None
    shape: Shape | None = None
    dtype: str | None = None
    pytree_path: str | None = None


class PortabilityMapping(StrictModel):
    """How a portable wrapper's plain containers map to the model's own types."""

    wrapped: bool
    original_input_types: list[str] = Field(default_factory=list)
    original_output_types: list[str] = Field(default_factory=list)
    leaf_paths: dict[str, str] = Field(
        default_factory=dict, description="Exported pytree path → path in the model's own types."
    )
    loader_imports: list[str] = Field(
        default_factory=list,
        description="Modules a loader must import when the original types are kept.",
    )


class SignatureDocument(StrictModel):
    """The top level of `signature.json`."""

    schema_version: str = SCHEMA_VERSION
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    range_constraints: list[RangeConstraint]
    dynamic_shapes: DynamicShapesSpec | None = None
    in_spec: str | None = Field(default=None, description="torch pytree spec, serialized.")
    out_spec: str | None = None
    portability: PortabilityMapping = Field(
        default_factory=lambda: PortabilityMapping(wrapped=False)
    )
