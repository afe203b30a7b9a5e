"""The user's names for the program's symbolic sizes: torch's `s43` → the `batch` declared.

torch.export names every dynamic size with a fresh symbol (`s43`, `s53`) and forgets the
`Dim` names of the spec. `dim_names` recovers them by walking the spec (torch form: what
`torch.export.export` was called with) alongside the example inputs and reading the
symbol at each declared position of the program's user inputs. A derived dim
(`2*batch + 1`) names the root symbol it is built from. Dims without a name
(`Dim.AUTO`, `Dim.DYNAMIC`) keep torch's symbol.

`rename` applies the mapping to a size expression; the documents, the verification
samples and the ONNX model all use the same mapping, so the user meets one name per dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

__all__ = ["DimNames", "dim_names", "rename"]

DimNames = Mapping[str, str]
"""torch's symbol (`s43`) → the user's dim name (`batch`)."""


def dim_names(
    ep: torch.export.ExportedProgram,
    spec: Any,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, str]:
    """The user's name of each symbol of `ep`'s inputs that the spec declared by name.

    Args:
        ep: the program (its user-input placeholders carry the symbols).
        spec: the dynamic-shapes spec in torch's form, as the program was traced with it.
        module: the module traced (its `forward` signature keys a dict spec).
        args, kwargs: the example inputs.

    Returns:
        symbol → name; empty when the spec names nothing or cannot be aligned.
    """
    if spec is None:
        return {}
    by_leaf = _declared_dims(spec, module, args, kwargs)
    if not by_leaf:
        return {}
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    values = [
        placeholders[spec_.arg.name].meta.get("val")
        for spec_ in ep.graph_signature.input_specs
        if spec_.kind == torch.export.graph_signature.InputKind.USER_INPUT
        and getattr(spec_.arg, "name", None) in placeholders
    ]
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    if len(values) != len(leaves):
        return {}
    names: dict[str, str] = {}
    for value, leaf in zip(values, leaves, strict=True):
        dims = by_leaf.get(id(leaf))
        if not dims or not isinstance(value, torch.Tensor):
            continue
        for index, dim in dims.items():
            if not isinstance(index, int) or not 0 <= index < value.dim():
                continue
            size = value.shape[index]
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            root = getattr(dim, "root", None)  # a derived dim: name its root's symbol
            name = getattr(root if root is not None else dim, "__name__", None)
            free = expr.free_symbols
            if not isinstance(name, str) or len(free) != 1:
                continue
            if root is None and not isinstance(expr, sympy.Symbol):
                continue
            names.setdefault(str(next(iter(free))), name)
    # A name that is also another, unnamed symbol of the program would merge the two.
    taken = {str(symbol) for symbol in ep.range_constraints} - set(names)
    return {symbol: name for symbol, name in names.items() if name not in taken}


def _declared_dims(
    spec: Any, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[int, dict[Any, Any]]:
    """id(example tensor) → {dim index: Dim} for the dims the spec declares with a name."""
    from torch.export.dynamic_shapes import _combine_args, _DimHint, _tree_map_with_path

    found: dict[int, dict[Any, Any]] = {}

    def visit(_path: Any, value: Any, dims: Any) -> None:
        if not isinstance(value, torch.Tensor) or dims is None:
            return
        items = dims.items() if isinstance(dims, dict) else enumerate(dims)
        named = {
            index: dim
            for index, dim in items
            if dim is not None and not isinstance(dim, _DimHint | int | str)
        }
        if named:
            found[id(value)] = named

    try:
        combined: Any = _combine_args(module, args, kwargs)
        if not isinstance(spec, dict):
            combined = type(spec)(combined.values())
        _tree_map_with_path(visit, combined, spec, tree_name="inputs")
    except Exception:  # a spec torch accepted in a form this walk does not follow
        return {}
    return found


def rename(expr: Any, names: DimNames | None) -> str:
    """A size expression as text, torch's symbols replaced by the user's names."""
    if names and isinstance(expr, sympy.Basic):
        swap = {s: sympy.Symbol(names[str(s)]) for s in expr.free_symbols if str(s) in names}
        if swap:
            expr = expr.xreplace(swap)
    return str(expr)
