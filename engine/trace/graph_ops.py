"""Reading FX graphs: an op's name as the documents write it, the ops of a graph and its
subgraphs counted, the subgraphs a graph refers to. Used by decomposition's report and
by the serialized documents."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["op_histogram", "subgraphs", "target_name"]


def target_name(target: Any) -> str:
    """The text form of an FX node target: `aten.add.Tensor`, `higher_order.cond`, ..."""
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    try:
        name = torch.fx.node._get_qualified_name(target)
    except Exception:  # an exotic callable; its repr still identifies it
        return repr(target)
    # builtins live in `_operator`, users know them as `operator`
    return name.removeprefix("_")


def op_histogram(
    graph_module: torch.fx.GraphModule, include_subgraphs: bool = True
) -> dict[str, int]:
    """Count of `call_function` nodes by target, over the graph and (by default) its subgraphs.

    Subgraphs are the bodies of `cond`, `map`, `while_loop`, ...: GraphModules reached
    through `get_attr` nodes; each is counted once even if several nodes refer to it.
    """
    counts: Counter[str] = Counter()
    modules = _graph_modules(graph_module) if include_subgraphs else iter([graph_module])
    for module in modules:
        for node in module.graph.nodes:
            if node.op == "call_function":
                counts[target_name(node.target)] += 1
    return dict(sorted(counts.items()))


def subgraphs(graph_module: torch.fx.GraphModule) -> dict[str, torch.fx.GraphModule]:
    """The GraphModules the graph refers to with `get_attr`, by attribute name."""
    found: dict[str, torch.fx.GraphModule] = {}
    for node in graph_module.graph.nodes:
        if node.op != "get_attr" or not isinstance(node.target, str):
            continue
        try:
            value = functools.reduce(getattr, node.target.split("."), graph_module)
        except AttributeError:
            continue
        if isinstance(value, torch.fx.GraphModule):
            found[node.target] = value
    return found


def _graph_modules(graph_module: torch.fx.GraphModule) -> Iterator[torch.fx.GraphModule]:
    seen: set[int] = set()
    pending = [graph_module]
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield module
        pending.extend(subgraphs(module).values())
