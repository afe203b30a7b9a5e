"""Dynamic shapes, JSON → torch: the contract's grammar (docs/contract.md §3) read
against the example inputs.

`to_torch` turns a JSON spec into the form `torch.export.export` takes. Whether a list or
dict is a per-dimension spec or mirrors a container argument is decided against the
example inputs: per-dimension where the example is a tensor. Names may be referenced
before they are declared: dims are collected first (`_Slot`s), declarations read in a
first pass, every dim resolved in a second. The spec's structure (arguments, containers,
what it leaves out) is walked by `engine.shapes.structure`, by the same rules as a module's
own torch-form spec.

Every mistake in a spec raises `InvalidRequest` with `details = {"path", "reason"}`;
`path` is dotted into the spec as the user wrote it (`"x.0"`, `"1.mask.2"`), `reason`
a stable token (see `REASONS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel
from torch.export import Dim
from torch.export.dynamic_shapes import _DimHint

from engine.shapes.structure import (
    Leaf,
    combined_inputs,
    invalid,
    is_declaration,
    join_path,
    walk_arguments,
)
from schemas import parse_dim_expression
from schemas.dynamic_shapes import DIM_NAME_PATTERN, KEYWORDS

__all__ = ["REASONS", "plain_json", "to_torch"]

REASONS = (
    "invalid_spec",
    "unknown_argument",
    "argument_not_given",
    "too_many_arguments",
    "structure_mismatch",
    "unknown_key",
    "not_a_tensor",
    "invalid_dim_index",
    "dim_out_of_range",
    "rank_mismatch",
    "invalid_dim",
    "invalid_dim_expression",
    "invalid_range",
    "reserved_name",
    "duplicate_dim",
    "undeclared_dim",
    "static_size_mismatch",
    "size_out_of_range",
    "derived_dim_negative",
)
"""Every `details["reason"]` that `to_torch` raises."""

_HINTS: dict[str, _DimHint] = {"auto": Dim.AUTO, "dynamic": Dim.DYNAMIC, "static": Dim.STATIC}
_NAME = re.compile(f"^{DIM_NAME_PATTERN}$")


def plain_json(spec: Any) -> Any:
    """The spec as plain JSON values: pydantic models (DimDeclaration) become dicts."""
    if isinstance(spec, BaseModel):
        return {k: v for k, v in spec.model_dump(mode="json").items() if v is not None}
    if isinstance(spec, dict):
        return {key: plain_json(value) for key, value in spec.items()}
    if isinstance(spec, list | tuple):
        return [plain_json(value) for value in spec]
    return spec


@dataclass
class _Slot:
    """One dimension position of a tensor in the spec, resolved in the second pass."""

    path: str
    spec: Any
    size: int


@dataclass
class _Declared:
    dim: Dim
    path: str


def to_torch(
    spec: Any, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Turn a JSON dynamic-shapes spec into the form `torch.export.export` takes.

    Args:
        spec: the JSON form (plain values, or as parsed into `schemas` models).
        module: the module to export; `forward`'s signature names the arguments.
        args: the example positional inputs.
        kwargs: the example keyword inputs.

    Returns:
        None, a dict keyed by argument name, or a list in argument order.

    Raises:
        InvalidRequest: the spec does not fit the grammar or the example inputs.
    """
    spec = plain_json(spec)
    if spec is None:
        return None
    signature, combined = combined_inputs(module, args, kwargs)
    if spec == "auto":
        return {name: _auto(value) for name, value in combined.items()}
    slots: list[_Slot] = []
    if not isinstance(spec, dict | list):
        raise invalid("", "invalid_spec", 'expected "auto", an object or a list')
    structure = walk_arguments(spec, signature, combined, _json_leaf(slots), declarations=True)
    declared = _declarations(slots)
    resolved = {id(slot): _resolve(slot, declared) for slot in slots}
    return _fill(structure, resolved)


def _auto(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {i: Dim.AUTO for i in range(value.dim())}
    if isinstance(value, list | tuple):
        return type(value)(_auto(v) for v in value)
    if isinstance(value, dict):
        return {k: _auto(v) for k, v in value.items()}
    return None


def _is_dim_leaf(spec: Any) -> bool:
    return spec is None or isinstance(spec, int | str) or is_declaration(spec)


def _json_leaf(slots: list[_Slot]) -> Leaf:
    """The JSON form at a tensor (its dims become `_Slot`s) or a scalar input."""

    def leaf(spec: Any, value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            return _tensor_spec(spec, value, path, slots)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and spec in ("auto", "dynamic", "static")
        ):
            # torch.export accepts Dim hints for int inputs
            return _HINTS[spec]
        raise invalid(path, "not_a_tensor", f"the input is a {type(value).__name__}, not a tensor")

    return leaf


def _tensor_spec(spec: Any, value: torch.Tensor, path: str, slots: list[_Slot]) -> Any:
    rank = value.dim()
    if isinstance(spec, str) and spec.strip() in KEYWORDS:
        # a keyword for the whole tensor applies to each of its dims
        return {i: _HINTS[spec.strip()] for i in range(rank)}
    if isinstance(spec, list):
        if len(spec) != rank:
            raise invalid(path, "rank_mismatch", f"{len(spec)} dims given, the tensor has {rank}")
        return [_slot(s, value, i, join_path(path, i), slots) for i, s in enumerate(spec)]
    if isinstance(spec, dict) and not is_declaration(spec):
        out: dict[int, Any] = {}
        for key, dim in spec.items():
            dim_path = join_path(path, key)
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise invalid(dim_path, "invalid_dim_index", "dim keys are indices") from None
            if not 0 <= index < rank:
                raise invalid(
                    dim_path, "dim_out_of_range", f"the tensor has {rank} dims", rank=rank
                )
            out[index] = _slot(dim, value, index, dim_path, slots)
        return out
    raise invalid(path, "invalid_spec", "a tensor's spec is an object or a list of dims")


def _slot(spec: Any, value: torch.Tensor, index: int, path: str, slots: list[_Slot]) -> Any:
    if spec is None:
        return None
    if not _is_dim_leaf(spec) or isinstance(spec, bool):
        raise invalid(path, "invalid_dim", "a dim is a declaration, a name, a keyword or an int")
    slot = _Slot(path, spec, int(value.shape[index]))
    slots.append(slot)
    return slot


def _declarations(slots: list[_Slot]) -> dict[str, _Declared]:
    """First pass: every declared name, so references may come before declarations."""
    declared: dict[str, _Declared] = {}
    for slot in slots:
        if not isinstance(slot.spec, dict):
            continue
        name = slot.spec.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise invalid(slot.path, "invalid_dim", "a dim name is an identifier")
        if name in KEYWORDS:
            raise invalid(slot.path, "reserved_name", f"{name!r} is a keyword", name=name)
        if name in declared:
            raise invalid(
                slot.path,
                "duplicate_dim",
                f"{name!r} is declared twice (first at {declared[name].path})",
                name=name,
                first=declared[name].path,
            )
        low, high = slot.spec.get("min"), slot.spec.get("max")
        for bound in (low, high):
            if bound is not None and (not isinstance(bound, int) or bound < 0):
                raise invalid(slot.path, "invalid_range", "min and max are integers >= 0")
        if low is not None and high is not None and high <= low:
            raise invalid(slot.path, "invalid_range", "max must exceed min", name=name)
        declared[name] = _Declared(Dim(name, min=low, max=high), slot.path)
    return declared


def _resolve(slot: _Slot, declared: dict[str, _Declared]) -> Any:
    """Second pass: one dim position to its torch value."""
    spec = slot.spec
    if isinstance(spec, int):
        if spec != slot.size:
            raise invalid(
                slot.path,
                "static_size_mismatch",
                f"static size {spec}, but the example has {slot.size}",
                expected=spec,
                actual=slot.size,
            )
        return spec
    if isinstance(spec, dict):
        dim = declared[spec["name"]].dim
        expr = spec.get("expr")
        if expr is None:
            _check_size(slot, dim)
            return dim
        parsed = _parse(slot.path, expr)
        if isinstance(parsed, str) or parsed[1] != spec["name"]:
            raise invalid(slot.path, "invalid_dim_expression", "expr must use the declared name")
        return _derive(slot.path, dim, parsed[0], parsed[2])
    parsed = _parse(slot.path, spec)
    if isinstance(parsed, str):
        return _HINTS[parsed]
    coeff, name, offset = parsed
    if name not in declared:
        raise invalid(slot.path, "undeclared_dim", f"{name!r} is not declared", name=name)
    root = declared[name].dim
    if coeff == 1 and offset == 0:
        _check_size(slot, root)
        return root
    return _derive(slot.path, root, coeff, offset)


def _parse(path: str, text: str) -> tuple[int, str, int] | str:
    try:
        return parse_dim_expression(text)
    except ValueError:
        raise invalid(path, "invalid_dim_expression", f"cannot read {text!r}") from None


def _check_size(slot: _Slot, dim: Dim) -> None:
    low, high = int(dim.min), dim.max
    if slot.size < low or (isinstance(high, int) and slot.size > high):
        raise invalid(
            slot.path,
            "size_out_of_range",
            f"the example's size {slot.size} is outside {dim!r}",
            actual=slot.size,
        )


def _derive(path: str, root: Dim, coeff: int, offset: int) -> Dim:
    if coeff < 1:
        raise invalid(path, "invalid_dim_expression", "the coefficient must be positive")
    if coeff * int(root.min) + offset < 0:
        raise invalid(
            path,
            "derived_dim_negative",
            f"at {root.__name__}={root.min} the dim would be negative: raise its min",
            name=root.__name__,
        )
    dim = root
    if coeff != 1:
        dim = coeff * dim
    if offset:
        dim = dim + offset if offset > 0 else dim - (-offset)
    return dim


def _fill(structure: Any, resolved: dict[int, Any]) -> Any:
    if isinstance(structure, _Slot):
        return resolved[id(structure)]
    if isinstance(structure, dict):
        return {k: _fill(v, resolved) for k, v in structure.items()}
    if isinstance(structure, list | tuple):
        items = [_fill(v, resolved) for v in structure]
        if hasattr(structure, "_fields"):  # a namedtuple
            return type(structure)(*items)
        return type(structure)(items)
    return structure
