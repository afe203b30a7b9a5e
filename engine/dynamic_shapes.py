"""Dynamic shapes: the contract's JSON grammar (docs/contract.md §3) to torch and back.

```
JSON                                          torch
"auto"                                        {arg: {i: Dim.AUTO for every tensor dim}}
{"x": {"0": {"name": "b", "min": 1}}}         {"x": {0: Dim("b", min=1)}}
{"y": {"0": "b"}} / "2*b+1" / "b-1"           the same Dim / 2*b + 1 / b - 1
"auto" | "dynamic" | "static" (a dim)         Dim.AUTO | Dim.DYNAMIC | Dim.STATIC
7                                             7 (static; must equal the example's size)
{"name": "h", "min": 1, "expr": "2*h"}        2*Dim("h", min=1), where h appears nowhere plain
```
Whether a list or dict is a per-dimension spec or mirrors a container argument is
decided against the example inputs: per-dimension where the example is a tensor.

Every mistake in a spec raises `InvalidRequest` with `details = {"path", "reason"}`;
`path` is dotted into the spec as the user wrote it (`"x.0"`, `"1.mask.2"`), `reason`
a stable token (see `REASONS`).

torch's constraint-violation errors end with "Suggested fixes:" lines
(`dimy = Dim('dimy', max=5)`, `dimx = dimy + 1`, `b = 4`); `suggested_fixes` extracts
them, `apply_fixes` applies them to a torch-form spec, `fix_to_json` renders one for
the report.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from pydantic import BaseModel
from torch.export import Dim
from torch.export.dynamic_shapes import (
    _DerivedDim,
    _DimHint,
    _DimHintType,
    _StaticDim,
    refine_dynamic_shapes_from_suggested_fixes,
)

from engine.errors import InvalidRequest
from schemas import DynamicShapeFix, parse_dim_expression
from schemas.dynamic_shapes import DIM_NAME_PATTERN, KEYWORDS

__all__ = [
    "REASONS",
    "Widened",
    "apply_fixes",
    "fix_to_json",
    "plain_json",
    "suggest_spec",
    "suggested_fixes",
    "to_json",
    "to_torch",
    "widen_size_one_dims",
]

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
_HINT_NAMES = {
    _DimHintType.AUTO: "auto",
    _DimHintType.DYNAMIC: "dynamic",
    _DimHintType.STATIC: "static",
}
_DECLARATION_KEYS = frozenset({"name", "min", "max", "expr"})
_NAME = re.compile(f"^{DIM_NAME_PATTERN}$")
_FIXES_HEADER = "Suggested fixes:"
_FIX_LINE = re.compile(r"^(?P<name>[^\s=]+) = (?P<rhs>.+)$")
_DIM_FIX = re.compile(r"^Dim\('(?P<name>[^']+)'(?P<bounds>.*)\)$")
_BOUND = re.compile(r"(?P<key>min|max)=(?P<value>\d+|oo)")


def _invalid(path: str, reason: str, message: str, **extra: Any) -> InvalidRequest:
    return InvalidRequest(
        f"dynamic_shapes{'.' + path if path else ''}: {message}",
        stage="tracing",
        details={"path": path, "reason": reason, **extra},
        hint="See the dynamic-shapes grammar in the contract (docs/contract.md §3).",
    )


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def plain_json(spec: Any) -> Any:
    """The spec as plain JSON values: pydantic models (DimDeclaration) become dicts."""
    if isinstance(spec, BaseModel):
        return {k: v for k, v in spec.model_dump(mode="json").items() if v is not None}
    if isinstance(spec, dict):
        return {key: plain_json(value) for key, value in spec.items()}
    if isinstance(spec, list | tuple):
        return [plain_json(value) for value in spec]
    return spec


# --------------------------------------------------------------------------- JSON → torch


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


def _combined_inputs(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]):
    """forward's parameters bound to the example inputs, as torch.export binds them."""
    signature = inspect.signature(module.forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise _invalid("", "invalid_spec", f"example inputs do not fit forward: {exc}") from exc
    return signature, dict(bound.arguments)


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
    signature, combined = _combined_inputs(module, args, kwargs)
    if spec == "auto":
        return {name: _auto(value) for name, value in combined.items()}
    slots: list[_Slot] = []
    structure: dict[str, Any] | list[Any]
    if isinstance(spec, dict):
        structure = _top_level_dict(spec, signature, combined, slots)
    elif isinstance(spec, list):
        values = list(combined.values())
        if len(spec) > len(values):
            raise _invalid(
                str(len(values)),
                "too_many_arguments",
                f"{len(spec)} entries for {len(values)} inputs",
            )
        padded = spec + [None] * (len(values) - len(spec))
        structure = [
            _walk(s, v, str(i), slots) for i, (s, v) in enumerate(zip(padded, values, strict=True))
        ]
    else:
        raise _invalid("", "invalid_spec", 'expected "auto", an object or a list')
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


def _top_level_dict(
    spec: dict[str, Any],
    signature: inspect.Signature,
    combined: dict[str, Any],
    slots: list[_Slot],
) -> dict[str, Any]:
    var_keyword = next(
        (p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None
    )
    structure: dict[str, Any] = {name: None for name in combined}
    extra: dict[str, Any] = {}
    for name, arg_spec in spec.items():
        if name in combined and name != var_keyword:
            structure[name] = _walk(arg_spec, combined[name], name, slots)
        elif var_keyword is not None and name in combined.get(var_keyword, {}):
            # forward(self, x, **kw): the user names the keyword, not "kw"
            extra[name] = _walk(arg_spec, combined[var_keyword][name], name, slots)
        elif name == var_keyword:
            structure[name] = _walk(arg_spec, combined[name], name, slots)
        elif name in signature.parameters:
            raise _invalid(name, "argument_not_given", f"no example input for {name!r}")
        else:
            raise _invalid(
                name,
                "unknown_argument",
                f"forward has no argument {name!r}",
                arguments=list(combined),
            )
    if extra and var_keyword is not None:
        kw_spec = structure[var_keyword] or {}
        structure[var_keyword] = {
            key: extra.get(key, kw_spec.get(key)) for key in combined[var_keyword]
        }
    return structure


def _is_dim_leaf(spec: Any) -> bool:
    return spec is None or isinstance(spec, int | str) or _is_declaration(spec)


def _is_declaration(spec: Any) -> bool:
    return isinstance(spec, dict) and "name" in spec and set(spec) <= _DECLARATION_KEYS


def _walk(spec: Any, value: Any, path: str, slots: list[_Slot]) -> Any:
    """Check one argument's spec against its example; dims become `_Slot`s."""
    if spec is None:
        return None
    if isinstance(value, torch.Tensor):
        return _tensor_spec(spec, value, path, slots)
    if isinstance(value, list | tuple):
        if not isinstance(spec, list) or len(spec) != len(value):
            raise _invalid(
                path,
                "structure_mismatch",
                f"expected a list of {len(value)} entries mirroring the input",
            )
        return type(value)(
            _walk(s, v, _join(path, i), slots)
            for i, (s, v) in enumerate(zip(spec, value, strict=True))
        )
    if isinstance(value, dict):
        if not isinstance(spec, dict) or _is_declaration(spec):
            raise _invalid(path, "structure_mismatch", "expected an object mirroring the input")
        for key in spec:
            if key not in value:
                raise _invalid(_join(path, key), "unknown_key", f"the input has no key {key!r}")
        return {key: _walk(spec.get(key), v, _join(path, key), slots) for key, v in value.items()}
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and spec in ("auto", "dynamic", "static")
    ):
        # torch.export accepts Dim hints for int inputs
        return _HINTS[spec]
    raise _invalid(path, "not_a_tensor", f"the input is a {type(value).__name__}, not a tensor")


def _tensor_spec(spec: Any, value: torch.Tensor, path: str, slots: list[_Slot]) -> Any:
    rank = value.dim()
    if isinstance(spec, str) and spec.strip() in KEYWORDS:
        # a keyword for the whole tensor applies to each of its dims
        return {i: _HINTS[spec.strip()] for i in range(rank)}
    if isinstance(spec, list):
        if len(spec) != rank:
            raise _invalid(path, "rank_mismatch", f"{len(spec)} dims given, the tensor has {rank}")
        return [_slot(s, value, i, _join(path, i), slots) for i, s in enumerate(spec)]
    if isinstance(spec, dict) and not _is_declaration(spec):
        out: dict[int, Any] = {}
        for key, dim in spec.items():
            dim_path = _join(path, key)
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise _invalid(dim_path, "invalid_dim_index", "dim keys are indices") from None
            if not 0 <= index < rank:
                raise _invalid(
                    dim_path, "dim_out_of_range", f"the tensor has {rank} dims", rank=rank
                )
            out[index] = _slot(dim, value, index, dim_path, slots)
        return out
    raise _invalid(path, "invalid_spec", "a tensor's spec is an object or a list of dims")


def _slot(spec: Any, value: torch.Tensor, index: int, path: str, slots: list[_Slot]) -> Any:
    if spec is None:
        return None
    if not _is_dim_leaf(spec) or isinstance(spec, bool):
        raise _invalid(path, "invalid_dim", "a dim is a declaration, a name, a keyword or an int")
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
            raise _invalid(slot.path, "invalid_dim", "a dim name is an identifier")
        if name in KEYWORDS:
            raise _invalid(slot.path, "reserved_name", f"{name!r} is a keyword", name=name)
        if name in declared:
            raise _invalid(
                slot.path,
                "duplicate_dim",
                f"{name!r} is declared twice (first at {declared[name].path})",
                name=name,
                first=declared[name].path,
            )
        low, high = slot.spec.get("min"), slot.spec.get("max")
        for bound in (low, high):
            if bound is not None and (not isinstance(bound, int) or bound < 0):
                raise _invalid(slot.path, "invalid_range", "min and max are integers >= 0")
        if low is not None and high is not None and high <= low:
            raise _invalid(slot.path, "invalid_range", "max must exceed min", name=name)
        declared[name] = _Declared(Dim(name, min=low, max=high), slot.path)
    return declared


def _resolve(slot: _Slot, declared: dict[str, _Declared]) -> Any:
    """Second pass: one dim position to its torch value."""
    spec = slot.spec
    if isinstance(spec, int):
        if spec != slot.size:
            raise _invalid(
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
            raise _invalid(slot.path, "invalid_dim_expression", "expr must use the declared name")
        return _derive(slot.path, dim, parsed[0], parsed[2])
    parsed = _parse(slot.path, spec)
    if isinstance(parsed, str):
        return _HINTS[parsed]
    coeff, name, offset = parsed
    if name not in declared:
        raise _invalid(slot.path, "undeclared_dim", f"{name!r} is not declared", name=name)
    root = declared[name].dim
    if coeff == 1 and offset == 0:
        _check_size(slot, root)
        return root
    return _derive(slot.path, root, coeff, offset)


def _parse(path: str, text: str) -> tuple[int, str, int] | str:
    try:
        return parse_dim_expression(text)
    except ValueError:
        raise _invalid(path, "invalid_dim_expression", f"cannot read {text!r}") from None


def _check_size(slot: _Slot, dim: Dim) -> None:
    low, high = int(dim.min), dim.max
    if slot.size < low or (isinstance(high, int) and slot.size > high):
        raise _invalid(
            slot.path,
            "size_out_of_range",
            f"the example's size {slot.size} is outside {dim!r}",
            actual=slot.size,
        )


def _derive(path: str, root: Dim, coeff: int, offset: int) -> Dim:
    if coeff < 1:
        raise _invalid(path, "invalid_dim_expression", "the coefficient must be positive")
    if coeff * int(root.min) + offset < 0:
        raise _invalid(
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
        return type(structure)(_fill(v, resolved) for v in structure)
    return structure


# --------------------------------------------------------------------------- torch → JSON


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


# --------------------------------------------------------------------------- 0/1 specialization

WIDENED_SIZE = 2
"""The size a dynamic dim whose example is 1 is traced with."""


@dataclass
class Widened:
    """Example inputs widened along named dims whose example size is 1."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dims: list[dict[str, Any]]
    """Per root dim: `name`, `positions` (spec paths such as `"x.0"`), `example_size`,
    `traced_size`."""


def widen_size_one_dims(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], spec: Any
) -> Widened | None:
    """Copies of the example inputs that torch can trace a dynamic dim of size 1 with.

    torch specializes every dim whose example size is 0 or 1 to that constant (for a
    named `Dim`: "Constraints violated ... specialized it to be a constant (1)"). For each
    named root dim of the torch-form `spec` whose range reaches `WIDENED_SIZE` and whose
    every plain occurrence has size 1, the tensors are repeated along it (and along the
    dims derived from it, to the derived size) with `index_select`, so the values stay
    the example's. Hints (`Dim.AUTO`, `Dim.DYNAMIC`) are left alone: a dim of size 1 there
    is often a broadcast dim. None when there is nothing to widen.
    """
    if not isinstance(spec, dict | list | tuple):
        return None
    try:
        _, combined = _combined_inputs(module, args, kwargs)
    except InvalidRequest:
        return None
    positions: list[tuple[torch.Tensor, int, Dim, str]] = []

    def walk(sub: Any, value: Any, path: str) -> None:
        if not isinstance(sub, dict | list | tuple):
            return
        if isinstance(value, torch.Tensor):
            items = list(sub.items() if isinstance(sub, dict) else enumerate(sub))
            for index, dim in items:
                named = isinstance(dim, Dim) and not isinstance(dim, _StaticDim)
                if named and isinstance(index, int) and 0 <= index < value.dim():
                    positions.append((value, index, dim, _join(path, index)))
        elif isinstance(value, list | tuple) and isinstance(sub, list | tuple):
            for i, (s, v) in enumerate(zip(sub, value, strict=False)):
                walk(s, v, _join(path, i))
        elif isinstance(value, dict) and isinstance(sub, dict):
            for key, v in value.items():
                walk(sub.get(key), v, _join(path, key))

    if isinstance(spec, dict):
        for name, sub in spec.items():
            if name in combined:
                walk(sub, combined[name], name)
    else:
        for i, (sub, value) in enumerate(zip(spec, combined.values(), strict=False)):
            walk(sub, value, str(i))

    roots: dict[str, list[tuple[torch.Tensor, int, Dim, str]]] = {}
    for position in positions:
        dim = position[2]
        root = dim.root if isinstance(dim, _DerivedDim) else dim
        roots.setdefault(root.__name__, []).append(position)
    resize: dict[int, list[tuple[int, int]]] = {}
    dims: list[dict[str, Any]] = []
    for name, found in roots.items():
        plain = [p for p in found if not isinstance(p[2], _DerivedDim)]
        if not plain or any(int(t.shape[i]) != 1 for t, i, _, _ in plain):
            continue
        root = plain[0][2]
        if int(root.min) > WIDENED_SIZE or (isinstance(root.max, int) and root.max < WIDENED_SIZE):
            continue
        sizes = []
        for tensor, index, dim, _ in found:
            new = int(dim.fn(WIDENED_SIZE)) if isinstance(dim, _DerivedDim) else WIDENED_SIZE
            sizes.append((tensor, index, new))
        if any(int(t.shape[i]) < 1 or new < 1 for t, i, new in sizes):
            continue
        for tensor, index, new in sizes:
            resize.setdefault(id(tensor), []).append((index, new))
        dims.append(
            {
                "name": name,
                "positions": [path for _, _, _, path in found],
                "example_size": 1,
                "traced_size": WIDENED_SIZE,
            }
        )
    if not dims:
        return None

    def widen(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor) or id(leaf) not in resize:
            return leaf
        out = leaf.detach()
        for index, new in resize[id(leaf)]:
            rows = torch.arange(new, device=out.device) % out.shape[index]
            out = out.index_select(index, rows)
        return out.requires_grad_(leaf.requires_grad)

    new_args, new_kwargs = pytree.tree_map(widen, (tuple(args), dict(kwargs)))
    return Widened(args=new_args, kwargs=new_kwargs, dims=dims)


# --------------------------------------------------------------------------- a spec to suggest

_TOP_LEVEL = re.compile(r"^(?:args\[\d+\]|kwargs\['[^']*'\])$")
_INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8"})


def suggest_spec(inputs: list[Any]) -> dict[str, Any] | None:
    """A dynamic-shapes spec (JSON form) to propose for an export that had none.

    `inputs` are the report's input summaries. Only top-level tensor arguments with a
    parameter name are keyed. Dim 0 of each is a shared `batch` when at least one has rank
    2 or more and all have the same size there (size 1 is proposed too: it is traced
    widened, see `widen_size_one_dims`); dim 1 of each rank-2 integer tensor is `seq`
    (`seq_2`, ... for other sizes) when larger than 1. None when nothing is proposed.
    """
    tensors: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    for item in inputs:
        if item.name and item.shape is not None and _TOP_LEVEL.match(item.path):
            tensors.setdefault(item.name, list(item.shape))
            dtypes.setdefault(item.name, item.dtype or "")
    spec: dict[str, dict[str, Any]] = {}
    declared: set[str] = set()

    def put(arg: str, index: int, name: str, low: int) -> None:
        spec.setdefault(arg, {})[str(index)] = (
            name if name in declared else {"name": name, "min": low}
        )
        declared.add(name)

    ranked = {arg: shape for arg, shape in tensors.items() if shape}
    if (
        any(len(shape) >= 2 for shape in ranked.values())
        and len({shape[0] for shape in ranked.values()}) == 1
        and next(iter(ranked.values()))[0] >= 1
    ):
        for arg in ranked:
            put(arg, 0, "batch", 1)
    seq_names: dict[int, str] = {}
    for arg, shape in tensors.items():
        if len(shape) == 2 and dtypes[arg] in _INTEGER_DTYPES and shape[1] > 1:
            name = seq_names.setdefault(
                shape[1], "seq" if not seq_names else f"seq_{len(seq_names) + 1}"
            )
            put(arg, 1, name, 2)
    return {arg: dict(sorted(dims.items())) for arg, dims in spec.items()} or None


# --------------------------------------------------------------------------- suggested fixes


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
