"""The JSON grammar for dynamic shapes (docs/contract.md §3).

```
dynamic_shapes := "auto" | {arg_name: arg_spec, ...} | [arg_spec, ...]
arg_spec       := null | {dim_index: dim, ...} | [dim | null, ...] | nested list/dict
dim            := {"name": "batch", "min": 1, "max": 64} | "batch" | "2*batch" | "batch+1"
                | "2*batch+1" | "auto" | "dynamic" | "static" | 7
                | {"name": "half", "min": 1, "expr": "2*half"}   (a root only used derived)
```
Whether a list or dict is a per-dimension spec or mirrors a container argument is
decided against the example inputs, by the engine.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, SerializerFunctionWrapHandler, TypeAdapter, model_serializer
from typing_extensions import TypeAliasType

from schemas._base import StrictModel

DIM_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
KEYWORDS = ("auto", "dynamic", "static")
DIM_EXPRESSION = re.compile(
    rf"^\s*(?:(?P<coeff>\d+)\s*\*\s*)?(?P<name>{DIM_NAME_PATTERN})"
    rf"(?:\s*(?P<sign>[+-])\s*(?P<offset>\d+))?\s*$"
)
"""`name`, `k*name`, `name+c`, `name-c`, `k*name+c` (the keywords are matched first)."""


DimExpression = Annotated[
    str,
    Field(
        pattern=rf"^\s*(?:auto|dynamic|static|(?:\d+\s*\*\s*)?{DIM_NAME_PATTERN}(?:\s*[+-]\s*\d+)?)\s*$",
        description='A reference ("batch"), a derived dim ("2*batch+1") or auto/dynamic/static.',
    ),
]


class DimDeclaration(StrictModel):
    """Declares a named dimension; other places refer to it by name."""

    name: Annotated[str, Field(pattern=f"^{DIM_NAME_PATTERN}$")]
    min: Annotated[int | None, Field(ge=0)] = None
    max: Annotated[int | None, Field(ge=0)] = None
    expr: DimExpression | None = Field(
        default=None,
        description=(
            'This position holds an expression of the declared dim, e.g. "2*half" with '
            'name "half": for a root that appears only inside derived dims.'
        ),
    )

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A declaration is written as users write it: unset bounds are left out.
        return {key: value for key, value in handler(self).items() if value is not None}


ArgSpec = TypeAliasType(  # type: ignore[misc]
    "ArgSpec",
    Annotated[
        Union[
            None,
            Annotated[int, Field(ge=0)],
            DimExpression,
            DimDeclaration,
            dict[str, "ArgSpec"],  # type: ignore[misc]
            list["ArgSpec"],  # type: ignore[misc]
        ],
        Field(union_mode="left_to_right"),
    ],
)
"""A dimension, or a per-dimension spec of a tensor, or a spec mirroring a container."""

DynamicShapesSpec = TypeAliasType(  # type: ignore[misc]
    "DynamicShapesSpec",
    Annotated[
        Union[Literal["auto"], dict[str, ArgSpec], list[ArgSpec]],
        Field(union_mode="left_to_right"),
    ],
)

dynamic_shapes_adapter: TypeAdapter[object] = TypeAdapter(DynamicShapesSpec)


def parse_dim_expression(text: str) -> tuple[int, str, int] | str:
    """Split a dim string into (coefficient, name, offset), or return the keyword.

    Raises:
        ValueError: the text is not of the grammar.
    """
    stripped = text.strip()
    if stripped in KEYWORDS:
        return stripped
    match = DIM_EXPRESSION.match(stripped)
    if match is None:
        raise ValueError(f"not a dimension expression: {text!r}")
    coeff = int(match["coeff"]) if match["coeff"] else 1
    offset = int(match["offset"]) if match["offset"] else 0
    if match["sign"] == "-":
        offset = -offset
    return coeff, match["name"], offset
