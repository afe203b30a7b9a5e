"""Dynamic shapes and the example inputs' sizes: widening size-1 dims, proposing a spec.

torch specializes a dim whose example size is 0 or 1 to that constant;
`widen_size_one_dims` makes copies of the example inputs that let a named dynamic dim be
traced at `WIDENED_SIZE` instead. `suggest_spec` proposes a JSON spec from the report's
input summaries for an export that had none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim
from torch.export.dynamic_shapes import _DerivedDim, _StaticDim

from engine.errors import InvalidRequest
from engine.shapes.structure import combined_inputs, join_path

__all__ = ["WIDENED_SIZE", "Widened", "suggest_spec", "widen_size_one_dims"]

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
        _, combined = combined_inputs(module, args, kwargs)
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
                    positions.append((value, index, dim, join_path(path, index)))
        elif isinstance(value, list | tuple) and isinstance(sub, list | tuple):
            for i, (s, v) in enumerate(zip(sub, value, strict=False)):
                walk(s, v, join_path(path, i))
        elif isinstance(value, dict) and isinstance(sub, dict):
            for key, v in value.items():
                walk(sub.get(key), v, join_path(path, key))

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
