"""Dynamic shapes, torch → JSON, and torch's suggested fixes.

`to_json` renders a torch-form spec in the contract's JSON form (docs/contract.md §3).
torch's constraint-violation errors end with "Suggested fixes:" lines
(`dimy = Dim('dimy', max=5)`, `dimx = dimy + 1`, `b = 4`); `suggested_fixes` extracts
them, `apply_fixes` applies them to a torch-form spec, `fix_to_json` renders one for
the report.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from torch.export import Dim
from torch.export.dynamic_shapes import (
    _DerivedDim,
    _DimHint,
    _DimHintType,
    _StaticDim,
    refine_dynamic_shapes_from_suggested_fixes,
)

from schemas import DynamicShapeFix, parse_dim_expression

__all__ = ["apply_fixes", "fix_to_json", "suggested_fixes", "to_json"]

_HINT_NAMES = {
    _DimHintType.AUTO: "auto",
    _DimHintType.DYNAMIC: "dynamic",
    _DimHintType.STATIC: "static",
}
_FIXES_HEADER = "Suggested fixes:"
_FIX_LINE = re.compile(r"^(?P<name>[^\s=]+) = (?P<rhs>.+)$")
_DIM_FIX = re.compile(r"^Dim\('(?P<name>[^']+)'(?P<bounds>.*)\)$")
_BOUND = re.compile(r"(?P<key>min|max)=(?P<value>\d+|oo)")


def _linear(dim: _DerivedDim) -> tuple[int, int]:
    """(coefficient, offset) of a derived dim: fn is `x ↦ a*x + b`, so two points suffice."""
    b = int(dim.fn(0))
    return int(dim.fn(1)) - b, b


def _expression(coeff: int, name: str, offset: int) -> str:
    text = f"{coeff}*{name}" if coeff != 1 else name
    if offset > 0:
        text += f"+{offset}"
    elif offset < 0:
        text += f"-{-offset}"
    return text


def _declaration(dim: Dim) -> dict[str, Any]:
    out: dict[str, Any] = {"name": dim.__name__}
    low, high = dim.min, dim.max
    if isinstance(low, int) and low != 0:
        out["min"] = int(low)
    if isinstance(high, int):  # unbounded is torch's int_oo, not an int
        out["max"] = high
    return out


def to_json(torch_spec: Any) -> Any:
    """The contract's JSON form of a torch dynamic-shapes spec.

    A named dim's first plain occurrence becomes its declaration, later ones its name;
    a root that only appears inside derived dims is declared with `expr` there. Hint
    bounds (`Dim.AUTO(min=...)`) have no JSON form and are dropped.

    Raises:
        ValueError: the spec holds something that is not a dynamic-shapes value.
    """
    plain_roots: set[str] = set()
    for leaf in _leaves(torch_spec):
        if isinstance(leaf, Dim) and not isinstance(leaf, _DerivedDim | _StaticDim):
            plain_roots.add(leaf.__name__)
    declared: set[str] = set()

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool):
            raise ValueError(f"not a dynamic-shapes value: {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, _DimHint):
            return _HINT_NAMES[value.type]
        if isinstance(value, _StaticDim):
            return int(value.value)
        if isinstance(value, _DerivedDim):
            root = value.root
            coeff, offset = _linear(value)
            expr = _expression(coeff, root.__name__, offset)
            if root.__name__ in declared or root.__name__ in plain_roots:
                return expr
            declared.add(root.__name__)
            return {**_declaration(root), "expr": expr}
        if isinstance(value, Dim):
            if value.__name__ in declared:
                return value.__name__
            declared.add(value.__name__)
            return _declaration(value)
        if isinstance(value, dict):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        raise ValueError(f"not a dynamic-shapes value: {type(value).__name__}")

    return convert(torch_spec)


def _leaves(spec: Any):
    if isinstance(spec, dict):
        for value in spec.values():
            yield from _leaves(value)
    elif isinstance(spec, list | tuple):
        for value in spec:
            yield from _leaves(value)
    else:
        yield spec


def suggested_fixes(message: str) -> list[str]:
    """The lines under "Suggested fixes:" in a torch constraint-violation message."""
    if _FIXES_HEADER not in message:
        return []
    fixes: list[str] = []
    for line in message.split(_FIXES_HEADER, 1)[1].splitlines():
        stripped = line.strip()
        if not stripped:
            if fixes:
                break  # the blank line that ends the section
            continue
        if not _FIX_LINE.match(stripped):
            break
        fixes.append(stripped)
    return fixes


def apply_fixes(message: str, torch_spec: Any) -> Any:
    """Apply the suggested fixes of `message` to a torch-form spec.

    Uses `refine_dynamic_shapes_from_suggested_fixes` on the fix lines only (it fails on
    the full error text); Dim.AUTO/DYNAMIC/STATIC survive unchanged.

    Raises:
        ValueError: the message has no fixes, or torch cannot apply them to this spec.
    """
    fixes = suggested_fixes(message)
    if not fixes:
        raise ValueError("no suggested fixes in the message")
    hints: dict[str, _DimHint] = {}

    def hide(value: Any) -> Any:
        # torch's refine reads `.__name__` of every leaf, which hints lack
        if isinstance(value, _DimHint):
            name = f"_torchport_hint_{len(hints)}"
            hints[name] = value
            return Dim(name)
        return value

    def show(value: Any) -> Any:
        if isinstance(value, Dim) and value.__name__ in hints:
            return hints[value.__name__]
        return value

    hidden = _map_leaves(hide, torch_spec)
    try:
        refined = refine_dynamic_shapes_from_suggested_fixes(
            f"{_FIXES_HEADER}\n" + "\n".join(fixes), hidden
        )
    except Exception as exc:
        raise ValueError(f"torch could not apply the fixes: {type(exc).__name__}: {exc}") from exc
    return _map_leaves(show, refined)


def _map_leaves(fn: Callable[[Any], Any], spec: Any) -> Any:
    if isinstance(spec, dict):
        return {k: _map_leaves(fn, v) for k, v in spec.items()}
    if isinstance(spec, list | tuple):
        return type(spec)(_map_leaves(fn, v) for v in spec)
    return fn(spec)


def fix_to_json(fix_line: str) -> DynamicShapeFix:
    """One suggested-fix line with its contract JSON form.

    `dimy = Dim('dimy', max=5)` → `{"name": "dimy", "max": 5}`; `dimx = dimy + 1` →
    `"dimy+1"`; `b = 4` → `4`. A line of another shape keeps `spec` None.
    """
    text = fix_line.strip()
    match = _FIX_LINE.match(text)
    if match is None:
        return DynamicShapeFix(text=text)
    name, rhs = match["name"], match["rhs"].strip()
    spec: Any = None
    if declared := _DIM_FIX.match(rhs):
        spec = {"name": declared["name"]}
        for bound in _BOUND.finditer(declared["bounds"]):
            if bound["value"] != "oo" and not (bound["key"] == "min" and bound["value"] == "0"):
                spec[bound["key"]] = int(bound["value"])
    elif re.fullmatch(r"\d+", rhs):
        spec = int(rhs)
    else:
        try:
            parsed = parse_dim_expression(rhs.replace(" ", ""))
        except ValueError:
            parsed = None
        if isinstance(parsed, tuple):
            spec = _expression(*parsed)
    return DynamicShapeFix(text=text, name=name, spec=spec)
