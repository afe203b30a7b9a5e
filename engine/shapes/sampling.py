"""Sampled inputs for verification: drawn inside an exported program's dynamic ranges.

`draw_samples` reads the free symbols of the program's input shapes and their ranges
(`ep.range_constraints`), then builds inputs with each symbol at its minimum, at its
maximum, then at random values in between; derived dimensions such as `dimx + 1` follow
from the program's own shape expressions. Values are random, reproducible from a seed;
integer inputs stay inside the example's own value range.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

__all__ = ["draw_samples", "draw_values"]

_UNBOUNDED_FLOOR = 8
"""An unbounded symbol is drawn up to max(2 * its example value, its minimum + this)."""

_MAX_ELEMENTS = 1 << 24
"""A drawn input larger than this and than 16 * its example is not allocated."""


@dataclass
class _Symbol:
    lower: int
    upper: int


def draw_samples(
    ep: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    count: int,
    seed: int,
    names: Mapping[str, str] | None = None,
) -> list[tuple[str, dict[str, int], tuple[tuple[Any, ...], dict[str, Any]] | str]]:
    """`count` labelled inputs, or one reason why none can be drawn (no symbols: none);
    each with the sizes drawn per symbol, keyed by the user's dim name (`names`) if any."""
    user_vals = _user_input_values(ep)
    flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    if len(user_vals) != len(flat):
        return [
            (
                "min",
                {},
                f"{len(user_vals)} program inputs for {len(flat)} example input leaves",
            )
        ]
    symbols = _symbols(ep, user_vals, flat)
    if not symbols:
        return []
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    ordered = sorted(symbols, key=str)
    drawn: list[tuple[str, dict[str, int], tuple[tuple[Any, ...], dict[str, Any]] | str]] = []
    for index in range(count):
        if index == 0:
            label, values = "min", {s: symbols[s].lower for s in ordered}
        elif index == 1:
            label, values = "max", {s: symbols[s].upper for s in ordered}
        else:
            label = f"random-{index - 1}"
            values = {s: rng.randint(symbols[s].lower, symbols[s].upper) for s in ordered}
        drawn_sizes = {(names or {}).get(str(s), str(s)): v for s, v in values.items()}
        try:
            leaves = [
                _make_leaf(val, example, values, generator)
                for val, example in zip(user_vals, flat, strict=True)
            ]
        except ValueError as exc:
            drawn.append((label, drawn_sizes, str(exc)))
            continue
        sample_args, sample_kwargs = pytree.tree_unflatten(leaves, spec)
        drawn.append((label, drawn_sizes, (sample_args, sample_kwargs)))
    return drawn


def draw_values(
    args: tuple[Any, ...], kwargs: dict[str, Any], count: int, seed: int
) -> list[tuple[str, dict[str, int], tuple[tuple[Any, ...], dict[str, Any]] | str]]:
    """`count` inputs of the example's shapes with random values (integers inside the
    example's own value range, non-tensors as given): what a program without dynamic
    dimensions can be sampled with, for quantization's calibration and accuracy."""
    flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    generator = torch.Generator().manual_seed(seed)
    drawn: list[tuple[str, dict[str, int], tuple[tuple[Any, ...], dict[str, Any]] | str]] = []
    for index in range(count):
        leaves = [
            _random_like(leaf, list(leaf.shape), generator)
            if isinstance(leaf, torch.Tensor)
            else leaf
            for leaf in flat
        ]
        sample_args, sample_kwargs = pytree.tree_unflatten(leaves, spec)
        drawn.append((f"values-{index + 1}", {}, (sample_args, sample_kwargs)))
    return drawn


def _user_input_values(ep: torch.export.ExportedProgram) -> list[Any]:
    """The fake value of each user input, in the order of the flattened (args, kwargs)."""
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    values = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind != torch.export.graph_signature.InputKind.USER_INPUT:
            continue
        node = placeholders.get(spec.arg.name)
        if node is not None and "val" in node.meta:
            values.append(node.meta["val"])
        else:
            values.append(getattr(spec.arg, "value", None))
    return values


def _symbols(
    ep: torch.export.ExportedProgram, user_vals: list[Any], flat: list[Any]
) -> dict[sympy.Symbol, _Symbol]:
    """Every free symbol of the inputs' shapes with the range to draw it from."""
    examples: dict[sympy.Symbol, int] = {}
    free: set[sympy.Symbol] = set()
    for val, example in zip(user_vals, flat, strict=True):
        if not isinstance(val, torch.Tensor) or not isinstance(example, torch.Tensor):
            continue
        for dim, size in zip(val.shape, example.shape, strict=True):
            if isinstance(dim, torch.SymInt):
                expr = dim.node.expr
                free |= expr.free_symbols
                if isinstance(expr, sympy.Symbol):
                    examples.setdefault(expr, int(size))
    ranges = {str(k): v for k, v in ep.range_constraints.items()}
    symbols = {}
    for symbol in free:
        bounds = ranges.get(str(symbol))
        lower = int(bounds.lower) if bounds is not None and _finite(bounds.lower) else 0
        if bounds is not None and _finite(bounds.upper):
            upper = int(bounds.upper)
        else:
            upper = max(2 * examples.get(symbol, lower), lower + _UNBOUNDED_FLOOR)
        symbols[symbol] = _Symbol(lower=lower, upper=max(lower, upper))
    return symbols


def _make_leaf(
    val: Any,
    example: Any,
    values: dict[sympy.Symbol, int],
    generator: torch.Generator,
) -> Any:
    if not isinstance(example, torch.Tensor) or not isinstance(val, torch.Tensor):
        return example
    shape = []
    for dim in val.shape:
        if isinstance(dim, torch.SymInt):
            size = dim.node.expr.subs(values)
            if not size.is_Integer:
                raise ValueError(f"could not evaluate the size {dim.node.expr}")
            if int(size) < 0:
                raise ValueError(f"the size {dim.node.expr} is negative for these values")
            shape.append(int(size))
        else:
            shape.append(int(dim))
    numel = 1
    for size in shape:
        numel *= size
    if numel > max(_MAX_ELEMENTS, 16 * example.numel()):
        raise ValueError(f"an input of shape {shape} is too large to draw")
    return _random_like(example, shape, generator)


def _random_like(example: torch.Tensor, shape: list[int], generator: torch.Generator) -> Any:
    dtype = example.dtype
    if dtype == torch.bool:
        out = torch.randint(0, 2, shape, generator=generator).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        out = torch.randn(shape, generator=generator, dtype=torch.float64)
        if dtype.is_complex:
            imag = torch.randn(shape, generator=generator, dtype=torch.float64)
            out = torch.complex(out, imag)
        out = out.to(dtype)
    else:
        # Integers often index or count: stay inside the example's own value range.
        low, high = (0, 1)
        if example.numel():
            low, high = int(example.min()), int(example.max())
        out = torch.randint(low, high + 1, shape, generator=generator, dtype=torch.int64)
        out = out.to(dtype)
    return out.to(example.device).requires_grad_(example.requires_grad)


def _finite(bound: Any) -> bool:
    # torch's int_oo is a sympy number whose is_finite is not False.
    return isinstance(bound, sympy.Integer)
